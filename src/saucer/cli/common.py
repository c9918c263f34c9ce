"""What every ``saucer`` command shares: the consoles, the error contract, settings, stores and session names.

A user mistake is one sentence on stderr and a non-zero exit code, printed
literally (never read as markup) and never wrapped.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer

from saucer.cli.output import make_console, styled, visible
from saucer.context import Context
from saucer.store import (
    ConflictError,
    CorruptRecordError,
    EventStore,
    LeaseHeldError,
    NotParticipantError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    open_store,
)

__all__ = [
    "local_user",
    "parse_vars",
    "console",
    "err",
    "UserError",
    "fail",
    "friendly",
    "one_shot",
    "settings_for",
    "resolve_store_url",
    "store_settings",
    "open_existing_store",
    "open_ctx",
    "resolve_session",
    "program_name",
    "store_flag",
    "StoreOption",
    "ConfigOption",
    "DEFAULT_STORE",
    "LAST",
]

console = make_console()
err = make_console(stderr=True)

_P = ParamSpec("_P")
_R = TypeVar("_R")

DEFAULT_STORE = "sqlite:///.saucer/saucer.db"
#: The session name that means "the most recently updated session".
LAST = "last"

StoreOption = typer.Option(
    None,
    "--store",
    help="Store URL (memory://, sqlite:///path.db, postgresql://...). Default: store.url from saucer.toml, else sqlite:///.saucer/saucer.db.",
    envvar="SAUCER_STORE_URL",
)
ConfigOption = typer.Option(
    None,
    "--config",
    help="Settings file (default: ./saucer.toml when present); UFO's YAML (a file or its folder) is read too.",
)


class UserError(Exception):
    """A mistake of the user's, reported as one sentence and exit code 2."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: MESSAGE`` on stderr, exactly as given, and exit with ``code``."""
    err.print(styled(("error:", "bold red"), " ", visible(message, lines=True)), soft_wrap=True)
    raise typer.Exit(code)


def one_shot(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """For a command that reads, prints and exits: Python's cycle collector stays off while it
    runs. Its passes over the containers of a long session's decoded state cost more than
    reading them (JSON data holds no cycles), and the process ends before garbage could pile up.
    A command that goes on (``show --follow``) turns it back on."""
    import gc

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return wrapper


def friendly(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn expected errors into one clear sentence and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except SessionNotFoundError as exc:
            fail(f"{exc}. List sessions with: {program_name()} sessions")
        except (
            UserError,
            SessionExistsError,
            LeaseHeldError,
            ConflictError,
            CorruptRecordError,
            NotParticipantError,
        ) as exc:
            fail(str(exc))
        except _user_errors() as exc:
            fail(str(exc))
        except FileNotFoundError as exc:
            fail(f"no such file: {exc.filename or exc}")
        except ValueError as exc:  # bad values the user gave (versions, URLs, files); other errors are bugs
            fail(str(exc.args[0]) if exc.args else str(exc))
        except StoreError as exc:
            fail(f"store error: {exc}")
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


def local_user() -> str:
    """Who runs this command, as an author of sessions: ``user:<login name>`` (the submitting
    user of ``saucer run``, always a participant of the sessions it starts)."""
    import getpass

    try:
        return f"user:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name for this uid (a container)
        return f"user:{os.getuid()}"


def parse_vars(items: Sequence[str], option: str = "--var") -> dict[str, Any]:
    """``KEY=JSON`` items as a dict (a later KEY wins); :class:`UserError` in one line for a bad one."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"{option} {item!r}: write KEY=JSON, e.g. {option} phase='\"draft\"' or {option} retries=3")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{option} {key}: {text!r} is not JSON ({exc.msg} at column {exc.colno}); quote a string: {key}='\"...\"'"
            ) from None
    return out


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors of the engine and the settings that describe a user's mistake."""
    from saucer.config import ConfigError
    from saucer.engine.errors import EngineError

    return (ConfigError, EngineError)


def settings_for(config: Path | None, overrides: dict[str, Any] | None = None) -> Any:
    """The settings: defaults < ``saucer.toml`` (or ``config``: saucer's TOML or UFO's YAML) < ``SAUCER_*`` < ``overrides``."""
    if config is None and not os.path.lexists(CONFIG_FILE):
        # No file to read, so none in UFO's format either: the reader of UFO's files (its module is a
        # tenth of the settings' start-up) would only hand this on to load_settings.
        from saucer.config import load_settings

        return load_settings(None, overrides or {})
    from saucer.ufo_config import load_any_settings

    return load_any_settings(config, overrides or {})


#: The settings file read when there is no ``--config`` (``saucer.config.DEFAULT_CONFIG_FILE``).
CONFIG_FILE = "saucer.toml"
#: The sections of the settings (``saucer.config.Settings``): a ``SAUCER_<SECTION>`` or
#: ``SAUCER_<SECTION>_...`` variable may set one of them (tests check this list against the model).
SETTINGS_SECTIONS = (
    "system",
    "store",
    "mcp",
    "agents",
    "logs",
    "llm",
    "service",
    "desktop",
    "queue",
    "shell",
    "approvals",
)
#: ``SAUCER_*`` variables that set no store setting but ``store.url`` (``--store``'s own variable,
#: so typer has already read it) or are read by the store itself (its key).
_STORE_VARS_READ_ELSEWHERE = ("SAUCER_STORE_URL", "SAUCER_STORE_KEY")


def _default_settings_apply(config: Path | None) -> bool:
    """Whether the settings are bound to be the defaults: no ``--config``, no ``./saucer.toml``
    and no ``SAUCER_*`` variable that could set a section. Then the store's settings are known
    without reading the settings model (pydantic-settings is a fifth of a command's start-up)."""
    if config is not None or os.path.lexists(CONFIG_FILE):
        return False
    for var in os.environ:
        name = var.upper()
        if not name.startswith("SAUCER_") or name in _STORE_VARS_READ_ELSEWHERE:
            continue
        rest = name[len("SAUCER_") :]
        if any(rest == section.upper() or rest.startswith(section.upper() + "_") for section in SETTINGS_SECTIONS):
            return False
    return True


def store_settings(store: str | None, config: Path | None = None) -> tuple[str, list[str], str | None]:
    """The store's URL (``--store`` wins), ``store.encrypt`` and ``store.key_file``, as
    :func:`settings_for` would give them; read without the settings model when they are the defaults."""
    if _default_settings_apply(config):
        return store or DEFAULT_STORE, [], None
    settings = settings_for(config)
    return store or str(settings.store.url), list(settings.store.encrypt), settings.store.key_file


def resolve_store_url(store: str | None, config: Path | None = None) -> str:
    """``--store`` wins, then the settings (file, environment), then the default SQLite file."""
    if store:
        return store
    return store_settings(store, config)[0]


def open_configured_store(store: str | None, config: Path | None = None) -> EventStore:
    """The store of ``--store`` or the settings, with their ``store.encrypt`` and ``store.key_file``."""
    url, encrypt, key_file = store_settings(store, config)
    return open_store(url, encrypt=encrypt, key_file=key_file)


def open_existing_store(store: str | None, config: Path | None = None) -> EventStore:
    """The store, with a clear error when the default SQLite file does not exist yet."""
    url = resolve_store_url(store, config)
    if url.startswith("sqlite:///"):
        from saucer.store.sqlite import path_from_url

        path = path_from_url(url)
        if not path.exists():
            raise UserError(
                f"no saucer store at {path} yet; run a session first ({program_name()} demo) or pass --store URL"
            )
    return open_configured_store(url, config)


def open_ctx(store: EventStore, session_id: str, at: int | None = None) -> Context:
    """A read-only Context of the session at its head, or at version ``at``."""
    return Context.open(store, session_id, create=False, at=store.head(session_id) if at is None else at)


def resolve_session(store: EventStore, name: str) -> str:
    """The whole id a user means: an id, a unique prefix of one, or ``last`` (the most recently updated).

    An exact id always wins (a session may be called ``last``). Otherwise
    :class:`SessionNotFoundError`, or :class:`UserError` listing the sessions
    a prefix could mean.
    """
    if store.exists(name):
        return name
    if name == LAST:
        found = store.find_session_ids(limit=1)
        if not found:
            raise UserError(f"there are no sessions yet, so {LAST!r} names none; start one with: {program_name()} demo")
        return found[0]
    if name:
        matches = store.find_session_ids(name, limit=6)
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise UserError(f"{name!r} is the start of several session ids ({shown}); give more of it")
    raise SessionNotFoundError(name)


def _shortest(path: Path) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def program_name() -> str:
    """How the user can run saucer again: ``saucer`` when that is on PATH, else a path that works from here."""
    import shutil

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name != "saucer":  # python -m saucer
        return f"{_shortest(Path(sys.executable).absolute())} -m saucer"
    found = shutil.which("saucer")
    if found and Path(found).resolve() == Path(argv0).resolve():
        return "saucer"
    return _shortest(Path(argv0).absolute())


def store_flag(store: str | None) -> str:
    """`` --store URL`` to repeat in a printed command (quoted for a shell), or nothing."""
    if not store:
        return ""
    import shlex

    return f" --store {shlex.quote(store)}"


def fork_workspace(parent: str | None, fork_id: str, given: Path | None = None) -> Path:
    """The absolute workspace of a new fork: ``given``, else a new folder beside the parent's
    (``.saucer/forks/ID`` when the parent ran in the current directory).

    A fork never runs in its parent's workspace: a ``given`` folder that is the
    parent's, or inside it, or holds it, is a one-line error.
    """
    import re

    name = re.sub(r"[^A-Za-z0-9._-]", "_", fork_id)[:200] or "fork"
    if given is None:
        base = Path(parent).parent if parent else Path(".saucer") / "forks"
        return (base / name).resolve()
    own = given.resolve()
    if parent:
        theirs = Path(parent).resolve()
        if own == theirs or theirs in own.parents or own in theirs.parents:
            fail(
                f"--workspace {given}: a fork never runs in its parent's workspace ({theirs}); give it a folder of its own"
            )
    return own
