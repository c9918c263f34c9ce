"""``saucer store prune``, ``delete``, ``migrate`` (schema, ``--check``, ``--rewrite``) and ``rekey``.

``register(store_app)`` adds them to the ``saucer store`` group.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    err,
    friendly,
    open_configured_store,
    open_existing_store,
    resolve_session,
    resolve_store_url,
    settings_for,
)
from saucer.cli.session_cmds import SessionArgument
from saucer.context import prune

__all__ = ["register"]


def register(store_app: typer.Typer) -> None:
    """Add ``prune``, ``delete``, ``migrate`` and ``rekey`` to ``store_app``."""
    store_app.command("prune")(store_prune_cmd)
    store_app.command("delete")(store_delete_cmd)
    store_app.command("migrate")(store_migrate_cmd)
    store_app.command("rekey")(store_rekey_cmd)


@friendly
def store_migrate_cmd(
    check: bool = typer.Option(
        False, "--check", help="Report which sessions hold which record format versions; change nothing."
    ),
    rewrite: bool = typer.Option(
        False,
        "--rewrite",
        help="Rewrite records older than the newest format in it (optional, resumable: run it again after an interruption).",
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Create or upgrade the store's schema (opening a store does it too; this makes it explicit).

    Old records never need a rewrite to be read: they are upcast when read.
    --check lists, per session, how many events and snapshots are in each
    record format version; --rewrite stores the old ones again in the newest.
    """
    from saucer.store.maintenance import format_census, rewrite_old_records
    from saucer.store.upcast import FORMAT_VERSION

    if check and rewrite:
        raise UserError("pass --check or --rewrite, not both")
    url = resolve_store_url(store, config)
    with open_configured_store(store, config) as st:
        version = st.migrate()
        console.print(
            f"store {url} is at schema version {version}" if version is not None else f"store {url} needs no schema"
        )
        if url.split(":", 1)[0].lower() in ("postgresql", "postgres"):
            from saucer.cli.queue_cmds import migrate_queue_line

            console.print(migrate_queue_line(url))
        if check:
            census = format_census(st)
            old = [c for c in census if c.old]
            for c in census:
                events = ", ".join(f"v{v}: {n}" for v, n in sorted(c.events.items())) or "none"
                snaps = ", ".join(f"v{v}: {n}" for v, n in sorted(c.snapshots.items())) or "none"
                console.print(f"{c.session_id}: events {events}; snapshots {snaps}", markup=False, highlight=False)
            console.print(
                f"record format {FORMAT_VERSION} is the newest; {len(old)} of {len(census)} sessions hold older records"
                + (" (saucer store migrate --rewrite rewrites them; reading never needs it)" if old else "")
            )
        elif rewrite:
            failed: list[str] = []

            def skipped(sid: str, exc: Exception) -> None:
                failed.append(sid)
                err.print(f"{sid}: left as it is ({exc})", markup=False, highlight=False)

            def progress(sid: str, n: int) -> None:
                if n:
                    console.print(f"{sid}: {n} records rewritten", markup=False, highlight=False)

            total = rewrite_old_records(st, progress=progress, on_error=skipped)
            console.print(f"{total} records rewritten in record format {FORMAT_VERSION}")
            if failed:
                raise UserError(
                    f"{len(failed)} sessions could not be read and were left as they are: {', '.join(failed)}"
                )


@friendly
def store_rekey_cmd(
    new_key_file: Path = typer.Option(
        ...,
        "--new-key-file",
        help="File with the new key (base64 of 32 bytes); created with a fresh key if it does not exist.",
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Re-encrypt every value encrypted at rest with a new key.

    The current key comes from SAUCER_STORE_KEY or store.key_file. Resumable:
    an interrupted rekey is finished by running it again with the same keys.
    Afterwards, point SAUCER_STORE_KEY or store.key_file at the new key.
    """
    from saucer.store.crypto import load_key, new_key
    from saucer.store.maintenance import rekey

    settings = settings_for(config)
    old = load_key(settings.store.key_file)
    if old is None:
        raise UserError("saucer store rekey needs the current key: set SAUCER_STORE_KEY or store.key_file")
    if not new_key_file.exists():
        fd = os.open(new_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(new_key() + "\n")
        console.print(
            f"wrote a new key to {new_key_file} (keep it apart from the store)", markup=False, highlight=False
        )
    new = load_key(new_key_file, env={})
    assert new is not None
    with open_configured_store(store, config) as st:
        report = rekey(st, old, new)
    console.print(
        f"re-encrypted {report.values} values in {report.events} events and {report.snapshots} snapshots "
        f"of {report.sessions} sessions; from now on use the key in {new_key_file}",
        markup=False,
        highlight=False,
    )


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w`` in seconds."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _DURATION_UNITS else "s"
    number = raw[:-1] if raw[-1:] in _DURATION_UNITS else raw
    try:
        value = float(number)
    except ValueError:
        raise UserError(f"--older-than {text!r} is not a duration like 90s, 15m, 12h, 7d or 2w") from None
    if value < 0:
        raise UserError(f"--older-than {text!r} must not be negative")
    return value * _DURATION_UNITS[unit]


@friendly
def store_prune_cmd(
    session: str | None = typer.Argument(None, help="Session id, a unique prefix of one, or 'last' (or --all)."),
    all_sessions: bool = typer.Option(False, "--all", help="Prune every session."),
    keep_last: int | None = typer.Option(
        None, "--keep-last", min=0, help="Keep the newest N versions of each session."
    ),
    older_than: str | None = typer.Option(
        None, "--older-than", help="Drop versions committed longer ago than this (90s, 15m, 12h, 7d, 2w)."
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Drop old history; every remaining version stays readable (a snapshot is kept at the new start).

    Forks keep every version too: a fork that still reads the pruned history gets its own copy of it first.
    """
    if (session is None) == (not all_sessions):
        raise UserError("name one SESSION or pass --all")
    if keep_last is None and older_than is None:
        raise UserError("say what to keep: --keep-last N and/or --older-than DURATION")
    seconds = parse_duration(older_than) if older_than is not None else None
    with open_existing_store(store, config) as st:
        targets = [resolve_session(st, session)] if session is not None else [i.session_id for i in st.sessions()]
        for sid in targets:
            before = st.first_version(sid)
            forks = [i for i in st.sessions() if i.parent_id == sid]
            first = prune(st, sid, keep_last=keep_last, older_than=seconds)
            if first > before:
                console.print(f"{sid}: versions before {first} dropped (v{first}..v{st.head(sid)} remain)")
            else:
                console.print(f"{sid}: nothing to prune (v{first}..v{st.head(sid)} remain)")
            for fork in forks:
                if st.session_info(fork.session_id).parent_id is None:
                    console.print(
                        f"  fork {fork.session_id} now holds its own copy of the history it reads (up to v{fork.parent_version})"
                    )


@friendly
def store_delete_cmd(
    session: str = SessionArgument,
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Remove a session completely: its events, snapshots and lease."""
    from saucer.cli.interactor import stdin_is_terminal

    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        info = st.session_info(sid)
        if not yes:
            if not stdin_is_terminal():
                raise UserError(f"deleting {sid!r} cannot be undone: pass --yes to confirm")
            if not typer.confirm(f"delete session {sid} and its {info.version} versions?", default=False):
                raise typer.Exit(1)
        st.delete_session(sid)
    console.print(f"deleted session {sid}")
