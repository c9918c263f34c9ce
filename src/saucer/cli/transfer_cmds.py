"""The commands that copy a session: ``fork`` (a new session from a version), ``export`` and ``import``.

``register(app)`` adds them to the ``saucer`` command line. An export is
written as it is read (a whole log never sits in memory) and never left
half-written under the name asked for; values encrypted at rest stay
encrypted unless ``--decrypt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import uuid
from pathlib import Path
from typing import Any

import typer

from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    err,
    fork_workspace,
    friendly,
    one_shot,
    open_configured_store,
    open_ctx,
    open_existing_store,
    program_name,
    resolve_session,
    store_flag,
)
from saucer.cli.output import JsonStream, binary_stdout, styled, visible
from saucer.cli.session_cmds import SessionArgument, state_data, streamed_state
from saucer.store.sealed import SealedStore

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``fork``, ``export`` and ``import`` to ``app``."""
    app.command("fork")(fork_cmd)
    app.command("export")(export_cmd)
    app.command("import")(import_cmd)


@friendly
def fork_cmd(
    session: str = typer.Argument(..., help="Session to fork: its id, a unique prefix of one, or 'last'."),
    at: int | None = typer.Option(None, "--at", help="Version to fork at (default: the latest)."),
    new_id: str | None = typer.Option(None, "--as", help="Id of the new session (default: generated)."),
    workspace: Path | None = typer.Option(
        None,
        "--workspace",
        "-w",
        help="The fork's own directory for the built-in tools, never its parent's "
        "(default: a new folder beside the parent's, printed).",
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Start a new session from a session's state at a version (its log is referenced, not copied).

    A fork never runs in its parent's workspace: its tools act in --workspace
    DIR, by default a new, empty folder beside the parent's (printed). A
    resumed fork writes its own log folder.
    """
    from saucer.engine.cursor import stored_session_brief

    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        target = new_id or f"{sid[:180]}-fork-{uuid.uuid4().hex[:6]}"
        own = fork_workspace(stored_session_brief(st, sid)[0].get("workspace"), target, workspace)
        parent = open_ctx(st, sid)
        child = parent.fork(target, at=at)
        version = child.version
        own.mkdir(parents=True, exist_ok=True)
        child.commit(author="user", meta={"kind": "fork", "workspace": str(own)})
        child.close()
    console.print(styled(f"forked {sid} at v{version} as ", (target, "bold")))
    console.print(f"  its tools act in: {visible(str(own))}")
    console.print("  (its own workspace: a fork never runs in its parent's)")
    flag = store_flag(store)
    console.print(f"  inspect it: {program_name()} state {shlex.quote(target)}{flag}")
    console.print(f"  run it: {program_name()} resume {shlex.quote(target)}{flag}")


@friendly
@one_shot
def export_cmd(
    session: str = SessionArgument,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to this file instead of standard output."),
    decrypt: bool = typer.Option(
        False,
        "--decrypt",
        help="Write values encrypted at rest in plain text (needs the store key); by default they stay encrypted.",
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Export a session's whole log and final state as JSON (written as it is read, whatever the log's length).

    Values encrypted at rest (store.encrypt) stay encrypted in the export, and
    read as <encrypted> in its state, unless --decrypt.
    """
    from saucer.context.transfer import Lineage, export_header

    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        # Without --decrypt, the records as the backend holds them: sealed values stay sealed.
        source = st.inner if isinstance(st, SealedStore) and not decrypt else st
        ctx = open_ctx(source, sid)
        if decrypt and ctx.encrypted:
            raise UserError(
                f"--decrypt needs the store key ({', '.join(sorted(ctx.encrypted))} are encrypted): "
                "set SAUCER_STORE_KEY or store.key_file"
            )
        lineage = Lineage()

        def fields() -> Any:
            # Each part is made when it is written and let go after: the session's meta (a whole
            # plan) is gone before the events stream, and the state is built after them.
            header = export_header(source, sid)
            for key in list(header):
                yield key, header.pop(key)
            yield (
                "events",
                (lineage.add(event).to_dict(summary=True) for event in source.iter_events(sid, upto=ctx.version)),
            )
            yield "lineage", lineage.segments
            yield "state", streamed_state(state_data(ctx))

        partial = None if output is None else output.with_name(f".{output.name}.partial")
        with contextlib.ExitStack() as stack:
            sink = binary_stdout() if partial is None else stack.enter_context(open(partial, "wb"))
            try:
                out = JsonStream(sink)
                out.object(fields())
                out.end()
            except BaseException:
                if partial is not None:
                    stack.close()
                    partial.unlink(missing_ok=True)  # never a half-written export under the name asked for
                raise
        if output is not None and partial is not None:
            os.replace(partial, output)
    if output is not None:
        count = sum(seg["to"] - seg["from"] + 1 for seg in lineage.segments)
        err.print(f"exported {sid} ({count} events) to {output}")


@friendly
def import_cmd(
    file: Path = typer.Argument(..., help="A file written by saucer export."),
    new_id: str | None = typer.Option(None, "--as", help="Import under this session id."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Import a session exported with saucer export."""
    from saucer.context.transfer import import_session

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"{file}: its JSON nests too deeply to be a saucer export") from None
    with open_configured_store(store, config) as st:
        info = import_session(st, data, new_id)
    console.print(styled("imported session ", (info.session_id, "bold"), f" at v{info.version}"))
