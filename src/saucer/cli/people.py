"""People in the loop: ``saucer set``, ``saucer vars``, ``saucer approvals``, ``saucer approve``, ``saucer refuse``,
``saucer answer``, ``saucer cancel``.

Each works on a running session (from another terminal, while it runs) as
well as on an ended one. A write is one event of the session with its author
(``--author``, default ``user:<login name>``): ``saucer history`` shows who
set what, and a decision on an approval, or the answer to a model's pending
question, is an event too (:mod:`saucer.engine.approvals`). ``saucer approvals``
lists both: one place shows everything that waits for a person. ``saucer cancel``
asks a running session to stop, wherever it runs (:mod:`saucer.engine.cancel`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import typer

from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    friendly,
    local_user,
    open_ctx,
    open_existing_store,
    parse_vars,
    program_name,
    resolve_session,
    store_flag,
)
from saucer.cli.output import print_json, styled, visible

__all__ = ["register"]

_SessionArgument = typer.Argument(
    ..., help="Session id, a unique prefix of one, or 'last' (the most recently updated)."
)
_AuthorOption = typer.Option(
    None, "--author", help="Who writes (recorded with the event). Default: user:<your login name>."
)


def _author(author: str | None) -> str:
    if author is None:
        return local_user()
    if not author.strip():
        raise UserError("--author must not be blank")
    return author


def _approvals(session: str | None, store: str | None, config: Path | None) -> list[Any]:
    """All approvals of ``session``, or the pending ones of every running session."""
    from saucer.engine.approvals import ApprovalError, pending_approvals, read_approvals

    with open_existing_store(store, config) as st:
        try:
            return pending_approvals(st) if session is None else read_approvals(st, resolve_session(st, session))
        except ApprovalError as exc:
            raise UserError(str(exc)) from None


def _decided_line(approval: Any) -> Any:
    verb = {"approved": "approved", "refused": "refused", "timed_out": "refused by timeout", "answered": "answered"}[
        approval.status
    ]
    line = styled(f"{approval.what} {approval.number} of session {visible(approval.session_id)} ", (verb, "bold"))
    line.append(f" by {visible(approval.decided_by or '')}")
    if approval.note:
        line.append(f": {visible(approval.note)}")
    return line


def register(app: typer.Typer) -> None:
    """Add ``set``, ``vars``, ``approvals``, ``approve``, ``refuse``, ``answer`` and ``cancel`` to ``app``."""

    @app.command("set")
    @friendly
    def set_cmd(
        session: str = _SessionArgument,
        assignments: list[str] | None = typer.Argument(
            None, help="KEY=JSON: the context variable KEY gets the JSON value."
        ),
        delete: list[str] | None = typer.Option(
            None, "--delete", help="Delete this context variable (repeat for several)."
        ),
        author: str | None = _AuthorOption,
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """Set or delete context variables of a session, running or ended, as one event with its author.

        A running session sees the new values at its next step (its routing
        conditions included); an ended one keeps them, and a resume starts
        from them. Deletes apply first, then sets. Values are JSON: 3, true,
        '"text"', '[1, 2]', '{"a": 1}'.
        """
        from saucer.engine.writes import write_vars

        values = parse_vars(assignments or [], option="saucer set SESSION")
        deleted = list(dict.fromkeys(delete or []))
        if not values and not deleted:
            raise UserError("nothing to write: give KEY=JSON and/or --delete KEY")
        who = _author(author)
        with open_existing_store(store, config) as st:
            sid = resolve_session(st, session)
            try:
                version = write_vars(st, sid, values, deleted, who)
            except (TypeError, ValueError) as exc:
                raise UserError(str(exc)) from None
        parts = []
        if values:
            parts.append("set " + ", ".join(values))
        if deleted:
            parts.append("deleted " + ", ".join(deleted))
        console.print(f"session {visible(sid)} v{version}: {visible('; '.join(parts))} (author {visible(who)})")

    @app.command("vars")
    @friendly
    def vars_cmd(
        session: str = _SessionArgument,
        at: int | None = typer.Option(None, "--at", help="Version to read (default: the latest)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object: variable -> value."),
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """The context variables of a session (what its routing conditions read), one per line as NAME = JSON."""
        with open_existing_store(store, config) as st:
            sid = resolve_session(st, session)
            variables = dict(open_ctx(st, sid, at).vars)
        if as_json:
            print_json(variables)
            return
        if not variables:
            console.print(
                f"session {visible(sid)} has no context variables; set one with: "
                f"{program_name()} set {sid} KEY=JSON{store_flag(store)}"
            )
            return
        for key in sorted(variables):
            console.print(f"{visible(key)} = {visible(json.dumps(variables[key], ensure_ascii=False, sort_keys=True))}")

    @app.command("approvals")
    @friendly
    def approvals_cmd(
        session: str | None = typer.Argument(
            None, help="A session: all its approvals. Default: the pending ones of every running session."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
        wait: float = typer.Option(
            0.0, "--wait", min=0, help="Wait up to this many seconds for a pending approval to appear (for scripts)."
        ),
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """Sensitive steps waiting for a person's decision (saucer approve / saucer refuse), the model's questions
        waiting for an answer (saucer answer), and past decisions and answers."""
        import time

        from saucer.engine.approvals import DEFAULT_POLL_INTERVAL, ApprovalError
        from saucer.store import SessionNotFoundError

        deadline = time.monotonic() + wait
        while True:  # with --wait, a store or a session not made yet (a run just started) is waited for too
            try:
                found = _approvals(session, store, config)
            except (UserError, SessionNotFoundError, ApprovalError):
                if time.monotonic() >= deadline:
                    raise
                found = []
            if any(a.pending for a in found) or time.monotonic() >= deadline:
                break
            time.sleep(DEFAULT_POLL_INTERVAL)
        if as_json:
            print_json([a.to_dict() for a in found])
            return
        if not found:
            console.print(
                "no pending approvals or questions"
                if session is None
                else f"session {visible(session)} has no approvals or questions"
            )
            return
        for a in found:
            state = a.status.replace("_", " ")
            if not a.pending:
                state += (f" by {a.decided_by}" if a.status != "timed_out" else "") + (f": {a.note}" if a.note else "")
            what = f"question: {a.detail}" if a.kind == "question" else f"{a.action} {a.detail}"
            line = f"{a.session_id} {a.number} {state} · {what}"
            if a.reason:
                line += f" · {a.reason}"
            console.print(visible(line))
        waiting = [a for a in found if a.pending]
        if any(a.kind == "approval" for a in waiting):
            first = next(a for a in waiting if a.kind == "approval")
            console.print(
                styled(
                    (
                        f"decide with: {program_name()} approve {first.session_id} {first.number}{store_flag(store)}"
                        f"  (or refuse ... --reason TEXT)",
                        "dim",
                    )
                )
            )
        if any(a.kind == "question" for a in waiting):
            first = next(a for a in waiting if a.kind == "question")
            console.print(
                styled(
                    (
                        f"answer with: {program_name()} answer {first.session_id} {first.number} TEXT{store_flag(store)}",
                        "dim",
                    )
                )
            )

    def _decide(
        session: str,
        number: int,
        status: Literal["approved", "refused", "answered"],
        author: str | None,
        note: str | None,
        store: str | None,
        config: Path | None,
    ) -> None:
        from saucer.engine.approvals import ApprovalError, decide

        who = _author(author)
        with open_existing_store(store, config) as st:
            sid = resolve_session(st, session)
            try:
                decided = decide(st, sid, number, status=status, author=who, note=note)
            except ApprovalError as exc:
                raise UserError(str(exc)) from None
        console.print(_decided_line(decided))

    @app.command("approve")
    @friendly
    def approve_cmd(
        session: str = _SessionArgument,
        number: int = typer.Argument(..., help="The approval's number (saucer approvals SESSION lists them)."),
        author: str | None = _AuthorOption,
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """Let a waiting sensitive step run; the decision is an event of the session with its author."""
        _decide(session, number, "approved", author, None, store, config)

    @app.command("refuse")
    @friendly
    def refuse_cmd(
        session: str = _SessionArgument,
        number: int = typer.Argument(..., help="The approval's number (saucer approvals SESSION lists them)."),
        reason: str | None = typer.Option(None, "--reason", help="Why (the agent is told)."),
        author: str | None = _AuthorOption,
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """Refuse a waiting sensitive step: it does not run, and its failed result says who refused it and why."""
        _decide(session, number, "refused", author, reason, store, config)

    @app.command("answer")
    @friendly
    def answer_cmd(
        session: str = _SessionArgument,
        number: int = typer.Argument(..., help="The question's number (saucer approvals SESSION lists them)."),
        text: str = typer.Argument(..., help="The answer: the model reads it as the user's."),
        author: str | None = _AuthorOption,
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """Answer the model's pending question (its ask_user call in a session with no terminal); the answer is an
        event of the session with its author, and the model reads it as the call's result."""
        _decide(session, number, "answered", author, text, store, config)

    @app.command("cancel")
    @friendly
    def cancel_cmd(
        session: str = _SessionArgument,
        reason: str | None = typer.Option(None, "--reason", help="Why (recorded with the cancel, shown in its end)."),
        wait: float = typer.Option(
            0.0, "--wait", min=0, help="Wait up to this many seconds for the session to end, and say how it ended."
        ),
        author: str | None = _AuthorOption,
        store: str | None = StoreOption,
        config: Path | None = ConfigOption,
    ) -> None:
        """Cancel a running session, wherever it runs (saucer run in another terminal, a worker, the server).

        The cancel is an event of the session with its author. The session's
        runner sees it, lets the step in flight finish and commit, starts no
        other, and ends the session as cancelled (a step waiting for an
        approval stops waiting: the approval is refused in your name). Only a
        running session can be cancelled.
        """
        import time

        from saucer.engine.cancel import CancelError, request_cancel
        from saucer.engine.status import stored_status

        who = _author(author)
        with open_existing_store(store, config) as st:
            sid = resolve_session(st, session)
            try:
                request = request_cancel(st, sid, author=who, reason=reason or "")
            except CancelError as exc:
                raise UserError(str(exc)) from None
            console.print(
                f"session {visible(sid)}: cancel requested by {visible(who)} (v{request.version}); "
                "its runner stops after the step in flight"
            )
            if wait <= 0:
                return
            deadline = time.monotonic() + wait
            status = stored_status(st, sid)
            while not status.ended and time.monotonic() < deadline:
                time.sleep(0.2)
                status = stored_status(st, sid)
        if not status.ended:
            raise UserError(f"session {sid!r} has not ended within {wait:g} s (it is {status.status})")
        why = status.summary.get("reason")
        console.print(f"session {visible(sid)} ended {status.status}" + (f": {visible(str(why))}" if why else ""))
