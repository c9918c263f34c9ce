"""Helpers shared by the built-in servers: sandbox paths, option parsing, the MCP form of a tool table."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, overload

from saucer.tools.native import NativeServer, ToolError, ToolOutcome, ToolSpec
from saucer.tools.sandbox import MAX_PATH_BYTES, SandboxError

if TYPE_CHECKING:
    import argparse

    # The MCP SDK is imported only where an MCP server is built (the stdio servers, build_server).
    from mcp.server.mcpserver import MCPServer

__all__ = [
    "SandboxError",
    "resolve_in_root",
    "relative_to_root",
    "env_default",
    "env_list",
    "existing_dir",
    "positive_int",
    "positive_float",
    "make_server",
    "make_mcp_server",
    "built_once",
    "ToolError",
    "guarded",
    "offload",
    "serve_stdio",
    "parse",
]

_T = TypeVar("_T")
_MAX_ERROR = 300


def resolve_in_root(root: Path, path: str | os.PathLike[str]) -> Path:
    """The real path of ``path`` (relative to ``root``, or absolute), refusing anything outside ``root``.

    Symbolic links are resolved before the check, so a link inside the root
    that points outside it is refused like ``..`` is. ``root`` must already be
    a resolved path. This is a check by name, good for the shell's working
    directory (a shell can ``cd`` anywhere anyway); the files tool resolves
    from a descriptor instead (:mod:`saucer.tools.sandbox`).
    """
    raw = os.fspath(path)
    if "\x00" in raw:
        raise SandboxError(f"path {raw!r} contains a NUL byte")
    if len(raw.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise SandboxError(f"path is longer than {MAX_PATH_BYTES} bytes")
    candidate = Path(raw) if os.path.isabs(raw) else root / raw
    real = Path(os.path.realpath(candidate))
    if real != root and root not in real.parents:
        raise SandboxError(f"path {raw!r} escapes the sandbox root {str(root)!r} (it resolves to {str(real)!r})")
    return real


def relative_to_root(root: Path, path: Path) -> str:
    """``path`` as shown to the model: relative to the root, ``.`` for the root itself."""
    rel = path.relative_to(root).as_posix()
    return rel or "."


@overload
def env_default(name: str, default: str) -> str: ...
@overload
def env_default(name: str, default: None = None) -> str | None: ...
def env_default(name: str, default: str | None = None) -> str | None:
    """The value of environment variable ``name`` or ``default`` (options: argv beats env beats default)."""
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_list(name: str) -> list[str]:
    """A newline-separated list from environment variable ``name`` (patterns may contain ``:``)."""
    value = os.environ.get(name, "")
    return [line.strip() for line in value.splitlines() if line.strip()]


def _argument_error(message: str) -> Exception:
    """argparse's ArgumentTypeError (argparse is imported only by the stdio servers' command lines)."""
    import argparse

    return argparse.ArgumentTypeError(message)


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise _argument_error(f"must be > 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if value <= 0:
        raise _argument_error(f"must be > 0, got {text}")
    return value


def make_server(name: str, instructions: str) -> MCPServer:
    """An MCPServer that logs warnings only, so a stdio server's stderr stays quiet.

    MCPServer configures the root logger when it is built (a rich handler, if
    none is installed yet); an in-process server must not change its host's
    logging, so the root logger's handlers and level are put back afterwards.
    """
    from mcp.server.mcpserver import MCPServer

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return MCPServer(name, instructions=instructions, log_level="WARNING", warn_on_duplicate_tools=True)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _mcp_tool(spec: ToolSpec) -> Callable[..., Any]:
    """``spec.fn`` for MCPServer: the same parameters, saucer's ToolError raised as the SDK's, an outcome as a result."""
    from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
    from mcp.types import CallToolResult, TextContent

    fn = spec.fn

    async def tool(**arguments: Any) -> Any:
        try:
            result = await fn(**arguments)
        except ToolError as exc:
            raise MCPToolError(str(exc)) from None
        if isinstance(result, ToolOutcome):
            return CallToolResult(
                content=[TextContent(type="text", text=result.text)],
                structured_content=result.structured,
                is_error=result.is_error,
            )
        return result

    signature = inspect.signature(fn, eval_str=True)
    returns = signature.return_annotation
    if returns is ToolOutcome or returns == "ToolOutcome":
        # Validated against the output model when it succeeds, as a structured result of that model.
        returns = Annotated[CallToolResult, spec.output]
    # inspect.signature reads __signature__ from any callable; typeshed does not declare it on functions.
    tool.__signature__ = signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
    tool.__name__ = tool.__qualname__ = fn.__name__
    tool.__doc__ = fn.__doc__
    return tool


def make_mcp_server(native: NativeServer) -> MCPServer:
    """The MCP server of a tool table: each tool registered on an MCPServer (quiet, as :func:`make_server`)."""
    from mcp.types import ToolAnnotations

    server = make_server(native.name, native.instructions)
    for spec in native.tools.values():
        hints = spec.annotations()
        server.add_tool(
            _mcp_tool(spec),
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=ToolAnnotations.model_validate(hints) if hints else None,
        )
    return server


_BUILT: OrderedDict[str, Any] = OrderedDict()
_BUILT_LOCK = threading.Lock()
_BUILT_KEEP = 32


def built_once(kind: str, options: dict[str, Any], build: Callable[[], _T]) -> _T:
    """The server ``build()`` makes for ``options``, built once and reused while it is among the last 32.

    Building compiles each tool's argument and result models, milliseconds
    each; an in-process server is stateless between calls and serves
    many clients at once, so sessions with the same options share one. A
    server pushed out is dropped by the cache only: whoever still uses it
    keeps it, and its resources are released when it is garbage.
    """
    key = kind + json.dumps(options, sort_keys=True, default=str)
    with _BUILT_LOCK:
        # The cache holds every kind's servers; ``kind`` leads the key, so an entry is a _T here.
        found: _T | None = _BUILT.get(key)
        if found is not None:
            _BUILT.move_to_end(key)
            return found
    built = build()
    with _BUILT_LOCK:
        kept: _T = _BUILT.setdefault(key, built)
        _BUILT.move_to_end(key)
        while len(_BUILT) > _BUILT_KEEP:
            _BUILT.popitem(last=False)
    return kept


class _DaemonWorkers:
    """Worker threads that are daemons, so a call that never returns cannot keep the process alive.

    ``asyncio.to_thread`` and anyio's worker threads are joined when the
    interpreter exits: one hung file operation of an in-process server would
    hang its host at exit. Idle workers are reused; at most ``limit`` run,
    further calls wait for one to be free (their caller's timeout still applies).
    """

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self._jobs: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._workers = 0
        self._idle = 0

    def submit(self, function: Callable[..., _T], args: tuple[Any, ...]) -> Future[_T]:
        future: Future[_T] = Future()
        with self._ready:
            self._jobs.append((future, function, args))
            # A waiting worker counts as idle until it has taken a job, so this never under-counts.
            if len(self._jobs) > self._idle and self._workers < self.limit:
                self._workers += 1
                threading.Thread(target=self._work, name="saucer-tool-worker", daemon=True).start()
            self._ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                future, function, args = self._jobs.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                    future.set_exception(exc)
            del future, function, args


_WORKERS = _DaemonWorkers()


async def offload(function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)`` in a daemon worker thread, awaited without blocking the event loop.

    Blocking tool work (file system calls, parsing a hostile command line)
    runs here so an in-process server never stalls its host's loop. A caller
    that is cancelled (a timeout) stops waiting; a call that already started
    finishes on its own.
    """
    return await asyncio.wrap_future(_WORKERS.submit(function, args))


def existing_dir(text: str) -> Path:
    """argparse type: an existing directory, returned resolved."""
    path = Path(os.path.realpath(Path(text).expanduser()))
    if not path.is_dir():
        raise _argument_error(f"{text!r} is not a directory")
    return path


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv`` (None: ``sys.argv[1:]``)."""
    return parser.parse_args(None if argv is None else list(argv))


def guarded(function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)``, with every failure turned into a :class:`ToolError` of one short line.

    A tool error is passed on as it is; anything else (a bug, ``RecursionError``,
    ``MemoryError``) becomes ``<Type>: <message>`` clipped to a few hundred
    characters, so the server never logs or renders a traceback for it.
    """
    try:
        return function(*args)
    except ToolError:
        raise
    except Exception as exc:  # noqa: BLE001 - the point is that nothing else escapes
        raise ToolError(one_line(exc)) from None


def one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line, clipped."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= _MAX_ERROR else line[: _MAX_ERROR - 3] + "..."


class _OneLineFormatter(logging.Formatter):
    """Log records as ``name: level: message`` on one line; an exception adds ``: Type: message``."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += ": " + one_line(record.exc_info[1])
        return " ".join(f"{record.name}: {record.levelname.lower()}: {text}".split())[:2000]


def _broken_pipe(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_broken_pipe(inner) for inner in exc.exceptions)
    return isinstance(exc, (BrokenPipeError, ConnectionResetError))


def serve_stdio(build: Callable[[], MCPServer], name: str) -> int:
    """Run the server ``build()`` makes over stdio; return the process exit status.

    Logging goes to stderr one line per record (installed before the server
    is built, so the SDK's rich handler with its tracebacks is never set up).
    A client that goes away (a killed device) gives one warning line and exit
    status 0, not a traceback; Ctrl-C exits with 130.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    try:
        build().run("stdio")
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if not _broken_pipe(exc):
            raise
        # Nobody reads stdout any more: make the interpreter's final flush a no-op too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        print(f"{name}: warning: the client closed the connection (broken pipe); exiting", file=sys.stderr)
    return 0
