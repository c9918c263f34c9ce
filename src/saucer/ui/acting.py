"""Acting on a session from its page: set and delete context variables, decide a pending
approval, answer a pending question, cancel a running session.

Off unless the host passes an :class:`Acting` to :func:`saucer.ui.create_app`:
``saucer ui`` does only with ``--allow-writes`` (read-only stays the default;
then every POST here answers 403 and the page shows no forms), ``saucer
serve`` always, for the principals :func:`saucer.service.approvals.may_act`
allows. Every POST passes the Origin check and needs the page's form token
(:mod:`saucer.ui.guard`); each write is an event whose author is the
principal (``Acting.author``). Writes go through the same functions as the
CLI: :func:`saucer.engine.writes.write_vars` (``saucer set``) and
:func:`saucer.engine.approvals.decide` (``saucer approve/refuse/answer``)::

    POST /sessions/{id}/act/vars        set=KEY=JSON (one per line), delete=NAME (repeatable)
    POST /sessions/{id}/act/approve     number=N
    POST /sessions/{id}/act/refuse      number=N, reason=TEXT (optional)
    POST /sessions/{id}/act/answer      number=N, answer=TEXT
    POST /sessions/{id}/act/cancel      reason=TEXT (optional): a running session stops after the step in flight
    POST /sessions/{id}/act/resume      (only when the host can resume: saucer ui starts ``saucer resume ID``)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from saucer.engine.approvals import (
    MAX_ANSWER_CHARS,
    ApprovalError,
    ApprovalNotFound,
    NotAllowedToDecide,
    decide,
    read_approvals,
)
from saucer.engine.cancel import CancelError, NotAllowedToCancel
from saucer.engine.status import stored_status
from saucer.engine.writes import write_vars
from saucer.store import EventStore, NotParticipantError

__all__ = ["Acting", "ActionRefused", "READ_ONLY", "RESUMABLE", "pending_of", "perform"]

#: What each form action records on the approval.
_DECIDED_AS: dict[str, Literal["approved", "refused", "answered"]] = {
    "approve": "approved",
    "refuse": "refused",
    "answer": "answered",
}

#: What a POST to a read-only viewer (``saucer ui`` without ``--allow-writes``) is told.
READ_ONLY = "this viewer is read-only: start it with saucer ui --allow-writes to act on sessions from their pages"
_ACTIONS = ("vars", "approve", "refuse", "answer", "cancel", "resume")
#: The statuses a session may be resumed from (from its page).
RESUMABLE = ("stopped", "failed", "interrupted", "not started")


@dataclass(frozen=True)
class Acting:
    """What a host lets its viewer's users do, and who they are when they do it.

    ``allowed(principal, session_id)``: whether the principal may act on that
    session; ``author(principal)``: the author its writes are recorded with;
    ``cancel(session_id, principal, reason)``: cancel a running session, returning a
    problem to show or None (absent: the host cannot cancel, and no cancel form
    is shown; ``saucer ui`` records the cancel in the session's log with
    :func:`saucer.engine.cancel.request_cancel`, as ``saucer cancel`` does);
    ``resume(session_id, principal)``: start resuming a stopped session, the
    same way (absent: no resume form)."""

    allowed: Callable[[str | None, str], Awaitable[bool]]
    author: Callable[[str | None], str]
    cancel: Callable[[str, str | None, str], Awaitable[str | None]] | None = None
    resume: Callable[[str, str | None], Awaitable[str | None]] | None = None


class ActionRefused(Exception):
    """An action that was not done: ``status`` (HTTP) and one sentence saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def pending_of(store: EventStore, session_id: str) -> list[Any]:
    """The session's approvals and questions that wait for a person (none for a session without any, or that
    has ended: nobody can decide them any more)."""
    try:
        if stored_status(store, session_id).ended:
            return []
        return [a for a in read_approvals(store, session_id) if a.pending]
    except ApprovalError:
        return []


def _one(form: dict[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0]


def _parse_sets(text: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, raw = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ActionRefused(400, f"{line.strip()!r}: write KEY=JSON, one per line")
        try:
            values[key] = json.loads(raw)
        except ValueError:
            raise ActionRefused(400, f'{key}: {raw.strip()!r} is not JSON (a string needs quotes: "text")') from None
    return values


def _number(form: dict[str, list[str]]) -> int:
    raw = _one(form, "number")
    if not raw.isdigit():
        raise ActionRefused(400, f"number={raw!r} is not an approval's number")
    return int(raw)


async def perform(
    acting: Acting, store: EventStore, session_id: str, principal: str | None, action: str, form: dict[str, list[str]]
) -> str:
    """Do ``action`` on the session as ``principal``; return one sentence saying what was done.
    Raises :class:`ActionRefused` for what was not done."""
    if action not in _ACTIONS or getattr(acting, action, True) is None:
        raise ActionRefused(404, f"no action {action!r} here")
    if not await acting.allowed(principal, session_id):
        raise ActionRefused(
            403, f"{principal!r} may not act on session {session_id!r} (its owner, its participants and the admins may)"
        )
    author = acting.author(principal)
    try:
        if action == "vars":
            values = _parse_sets(_one(form, "set"))
            deleted = list(dict.fromkeys(d.strip() for d in form.get("delete", []) if d.strip()))
            if not values and not deleted:
                raise ActionRefused(400, "nothing to write: give KEY=JSON lines and/or a name to delete")
            version = await asyncio.to_thread(write_vars, store, session_id, values, deleted, author)
            parts = (["set " + ", ".join(values)] if values else []) + (
                ["deleted " + ", ".join(deleted)] if deleted else []
            )
            return f"v{version}: {'; '.join(parts)} (author {author})"
        if action == "cancel":
            assert acting.cancel is not None
            reason = _one(form, "reason").strip()
            if len(reason) > 500:
                raise ActionRefused(400, "the reason must be at most 500 characters")
            problem = await acting.cancel(session_id, principal, reason)
            if problem is not None:
                raise ActionRefused(409, problem)
            return f"session {session_id}: cancelled by {author} (a step in flight finishes first)"
        if action == "resume":
            assert acting.resume is not None
            problem = await acting.resume(session_id, principal)
            if problem is not None:
                raise ActionRefused(409, problem)
            return f"session {session_id}: resume started by {author} (this page follows it)"
        number = _number(form)
        status = _DECIDED_AS[action]
        note = (_one(form, "answer" if action == "answer" else "reason")).strip() or None
        if action == "answer" and (note is None or len(note) > MAX_ANSWER_CHARS):
            raise ActionRefused(400, f"the answer must be non-blank and at most {MAX_ANSWER_CHARS} characters")
        decided = await asyncio.to_thread(decide, store, session_id, number, status=status, author=author, note=note)
        return f"{decided.what} {decided.number} {decided.status} by {author}"
    except (NotParticipantError, NotAllowedToDecide, NotAllowedToCancel) as exc:
        raise ActionRefused(403, str(exc)) from None
    except ApprovalNotFound as exc:
        raise ActionRefused(404, str(exc)) from None
    except (ApprovalError, CancelError) as exc:
        raise ActionRefused(409, str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ActionRefused(400, str(exc)) from None
