"""Commands and launched programs run confined by the kernel: Landlock, else bubblewrap, never silently neither.

A :class:`Policy` says what a command may do: write only beneath the
workspace, the session's artifacts folder and a private temporary folder
(its ``TMPDIR``), read what ``read`` lists (the whole file system by
default), and use the network as ``network`` says (``True``: freely;
``False``: no TCP; a list of ports: TCP connect to those only). ``sandbox``
chooses how that is enforced:

- ``landlock``: the kernel's Landlock (Linux 5.13+). A thread builds the
  ruleset, restricts *itself* (``landlock_restrict_self`` acts on the
  calling thread only) and from then on starts the programs (up to four such
  threads per policy, kept); the programs and all their descendants inherit
  the domain, the host's other threads stay free. The thread also drops the
  capabilities that reach past Landlock (loading a module, raw I/O,
  mounting...) from its bounding set, so a command run as root does not hold
  them either; as root it first takes a read-only mount namespace where only
  the writable folders are writable (:mod:`saucer.tools._mounts`), since
  Landlock cannot refuse ``chmod`` or ``chown`` of files root owns. No code
  runs between fork and exec (no ``preexec_fn``), and no helper process is
  started, so a command costs what it cost before plus a hand-over to a
  waiting thread;
- ``bubblewrap``: ``bwrap`` with a read-only bind of ``/`` (or of each
  ``read`` path), writable binds of the allowed folders, fresh ``/dev`` and
  ``/proc`` in a new PID namespace, no capability, and a network namespace
  of its own (no network) unless the network is allowed;
- ``auto`` (the default): Landlock when the kernel offers it, else bubblewrap;
- ``off``: no confinement, only when configured so; a one-line notice goes to
  standard error once per process.

When ``auto`` finds neither (or the one named is missing), every command is
refused with a sentence saying how to get one or to turn confinement off.
:func:`confinement_line` is the one description of what is in force, shown
by ``saucer doctor`` and at the start of ``saucer run``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.thread import BrokenThreadPool
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from saucer.tools import _mounts, landlock

if TYPE_CHECKING:
    import argparse

__all__ = [
    "SANDBOX_MODES",
    "Confinement",
    "ConfinementError",
    "Confiner",
    "Policy",
    "add_arguments",
    "bubblewrap_path",
    "confinement_line",
    "parse_network",
    "resolve",
]

SandboxMode = Literal["auto", "landlock", "bubblewrap", "off"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("auto", "landlock", "bubblewrap", "off")
#: Device files any command may write to (``> /dev/null``); nothing else of /dev.
_WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")
_notices: set[str] = set()
_notice_lock = threading.Lock()


class ConfinementError(RuntimeError):
    """No confinement can be put in force as configured; the message says what to install or set."""


@dataclass(frozen=True)
class Policy:
    """What confined programs may do (see the module docs); ``write`` are the folders besides the private temp."""

    sandbox: SandboxMode = "auto"
    write: tuple[str, ...] = ()
    read: tuple[str, ...] = ("/",)
    network: bool | tuple[int, ...] = True
    #: Keep signals and abstract UNIX sockets inside the domain (Landlock ABI 6+); off for GUI programs.
    scoped: bool = True

    @classmethod
    def create(
        cls,
        sandbox: str = "auto",
        write: Iterable[str | os.PathLike[str]] = (),
        read: Iterable[str | os.PathLike[str]] = ("/",),
        network: bool | Iterable[int] = True,
        scoped: bool = True,
    ) -> Policy:
        """A policy with its paths made absolute (the writable ones real); a ValueError names a bad value."""
        mode = next((m for m in SANDBOX_MODES if m == sandbox), None)
        if mode is None:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, got {sandbox!r}")
        ports: bool | tuple[int, ...] = network if isinstance(network, bool) else tuple(int(p) for p in network)
        if not isinstance(ports, bool) and any(not 0 < p < 65536 for p in ports):
            raise ValueError(f"network ports must be between 1 and 65535, got {list(ports)}")
        real = tuple(dict.fromkeys(os.path.realpath(os.fspath(p)) for p in write))
        # Read folders keep their names (/bin may be a link to /usr/bin: bubblewrap must show both).
        named = tuple(dict.fromkeys(os.path.abspath(os.fspath(p)) for p in read)) or ("/",)
        return cls(mode, real, named, ports, scoped)


@dataclass(frozen=True)
class Confinement:
    """What a sandbox setting resolves to on this machine: ``kind`` in force, or ``error`` (then nothing runs)."""

    kind: Literal["landlock", "bubblewrap", "off", "none"]
    detail: str
    error: str | None = None
    bwrap: str | None = field(default=None, compare=False)


def _landlock_abi() -> int:
    return landlock.abi_version()


@lru_cache(maxsize=1)
def _read_only_view_works() -> bool:
    """Whether a thread here can take a read-only mount namespace (root with CAP_SYS_ADMIN; tried once)."""
    if os.geteuid() != 0:
        return False
    result: list[bool] = []

    def attempt() -> None:
        try:
            result.append(_mounts.read_only_view(()))
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, name="saucer-confine-probe", daemon=True)
    thread.start()
    thread.join()
    return bool(result and result[0])


@lru_cache(maxsize=4)
def _bwrap_usable(path: str) -> str | None:
    """None when ``bwrap`` can build the sandbox used here, else why not (it may lack user namespaces)."""
    try:
        done = subprocess.run(
            [
                path,
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--unshare-pid",
                "--cap-drop",
                "ALL",
                "--",
                "true",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return (
        None if done.returncode == 0 else (done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}")
    )


def bubblewrap_path() -> str | None:
    """Where ``bwrap`` is on PATH, or None."""
    return shutil.which("bwrap")


def resolve(sandbox: str = "auto") -> Confinement:
    """What ``sandbox`` (auto, landlock, bubblewrap, off) puts in force here, or why nothing can be."""
    if sandbox == "off":
        return Confinement("off", 'off ([shell] sandbox = "off"): commands run unconfined')
    abi = _landlock_abi() if sandbox in ("auto", "landlock") else 0
    if abi >= 1:
        extra = (
            " and a read-only mount namespace (root: modes and owners outside are kept too)"
            if _read_only_view_works()
            else ""
        )
        return Confinement("landlock", f"Landlock ABI {abi}{extra}")
    missing_landlock = "this kernel offers no Landlock (Linux 5.13+ with landlock in its lsm= list)"
    if sandbox == "landlock":
        return Confinement("none", "none", f'[shell] sandbox = "landlock" but {missing_landlock}')
    bwrap = bubblewrap_path()
    problem = (
        "bwrap is not installed (Debian: apt-get install -y bubblewrap)" if bwrap is None else _bwrap_usable(bwrap)
    )
    if problem is None:
        return Confinement("bubblewrap", f"bubblewrap ({bwrap})", bwrap=bwrap)
    if sandbox == "bubblewrap":
        return Confinement("none", "none", f'[shell] sandbox = "bubblewrap" but {problem}')
    return Confinement(
        "none",
        "none",
        f"commands are refused: {missing_landlock}, and {problem}; install bubblewrap, or set "
        '[shell] sandbox = "off" to run commands unconfined',
    )


def confinement_line(policy: Policy, also: Sequence[str] = ()) -> str:
    """One line saying which confinement is in force for ``policy`` and what it allows (doctor, run);
    ``also`` describes more writable folders (e.g. "the session's artifacts folder")."""
    found = resolve(policy.sandbox)
    if found.error is not None:
        return f"confinement: none: {found.error}"
    if found.kind == "off":
        return f"confinement: {found.detail}"
    if policy.network is True:
        net = "network: allowed"
    elif policy.network is False or found.kind == "bubblewrap":
        net = "network: off" + (
            " (TCP; UDP is not covered by Landlock)"
            if found.kind == "landlock"
            else ""
            if policy.network is False
            else " (bubblewrap cannot open single ports)"
        )
    else:
        net = "network: TCP connect to ports " + ", ".join(map(str, policy.network))
    reads = "the whole file system" if policy.read == ("/",) else ", ".join(policy.read)
    writes = ", ".join((*policy.write, *also, "a private temporary folder (TMPDIR)"))
    return f"confinement: {found.detail}; reads: {reads}; writes: {writes}; {net}"


def notice_once(text: str) -> None:
    """Print ``text`` on standard error the first time it is given in this process."""
    with _notice_lock:
        if text in _notices:
            return
        _notices.add(text)
    print(f"saucer: {text}", file=sys.stderr, flush=True)


_POOL_THREADS = 4


def _confine_this_thread(policy: Policy, writable: tuple[str, ...], errors: list[BaseException]) -> None:
    """Start of a confining thread: root's read-only view, capabilities dropped, Landlock; for good."""
    try:
        _mounts.read_only_view(writable)  # root only: chmod/chown/utime outside fail too
        scopes = landlock.SCOPE_SIGNAL | (landlock.SCOPE_ABSTRACT_UNIX_SOCKET if policy.scoped else 0)
        with landlock.Ruleset(_landlock_abi(), net=policy.network is not True, scopes=scopes) as rules:
            for path in policy.read:
                rules.allow_path(path, landlock.FS_READ)
            for path in writable:  # one that vanished meanwhile is skipped by allow_path
                rules.allow_path(path, landlock.FS_WRITE)
            for path in _WRITABLE_DEVICES:
                rules.allow_path(path, landlock.FS_FILE_WRITE)
            if not isinstance(policy.network, bool):
                rules.allow_ports(policy.network)
            landlock.drop_capabilities()
            rules.restrict_self()
    except BaseException as exc:
        errors.append(exc)
        raise


def _popen(argv: list[str], options: dict[str, Any]) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **options)``: the options never ask for text mode, so its pipes carry bytes."""
    return subprocess.Popen(argv, **options)


class _ConfinedThreads:
    """Up to four threads confined once by a policy for the writable folders of the moment; they start programs.

    A thread keeps its domain (and, as root, its mount namespace) for its life, so a command
    costs a hand-over to a waiting thread, never a new ruleset, namespace or thread.
    """

    def __init__(self, policy: Policy, writable: tuple[str, ...]) -> None:
        self.writable = writable
        self.errors: list[BaseException] = []
        self.executor = ThreadPoolExecutor(
            _POOL_THREADS, "saucer-confined", initializer=_confine_this_thread, initargs=(policy, writable, self.errors)
        )

    def start(self, argv: list[str], popen: dict[str, Any]) -> Future[subprocess.Popen[bytes]]:
        outer: Future[subprocess.Popen[bytes]] = Future()

        def forward(inner: Future[subprocess.Popen[bytes]]) -> None:
            error = None if inner.cancelled() else inner.exception()
            started = None if inner.cancelled() or error else inner.result()
            if not outer.set_running_or_notify_cancel():
                if started is not None:  # the caller gave up: nothing will read or wait on it
                    for pipe in (started.stdout, started.stderr):
                        if pipe is not None:
                            pipe.close()
                return
            if started is not None:
                outer.set_result(started)
            elif error is not None:
                outer.set_exception(self._explain(error))
            else:
                outer.set_exception(ConfinementError("the confined start was cancelled"))

        try:
            self.executor.submit(_popen, argv, popen).add_done_callback(forward)
        except (BrokenThreadPool, RuntimeError) as exc:
            outer.set_exception(self._explain(exc))
        return outer

    def _explain(self, exc: BaseException) -> BaseException:
        if isinstance(exc, BrokenThreadPool):
            reason = self.errors[0] if self.errors else exc
            return ConfinementError(f"could not confine the command with Landlock: {reason}")
        return exc


def _release(tmpdir: str, threads: list[_ConfinedThreads]) -> None:
    for pool in threads:
        pool.executor.shutdown(wait=False)
    shutil.rmtree(tmpdir, ignore_errors=True)


class Confiner:
    """Starts programs under one :class:`Policy`, with a private temporary folder removed when it is collected."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.confinement = resolve(policy.sandbox)
        self.tmpdir = tempfile.mkdtemp(prefix="saucer-tmp-")
        self._threads: list[_ConfinedThreads] = []
        self._lock = threading.Lock()
        self._cleanup = weakref.finalize(self, _release, self.tmpdir, self._threads)

    @property
    def writable(self) -> tuple[str, ...]:
        """The writable folders that exist now (an artifacts folder may appear later), the private temp last."""
        return tuple(p for p in (*self.policy.write, self.tmpdir) if os.path.isdir(p))

    def check(self) -> None:
        """Raise :class:`ConfinementError` when nothing may run; announce an unconfined run once."""
        if self.confinement.error is not None:
            notice_once(self.confinement.error)
            raise ConfinementError(self.confinement.error)
        if self.confinement.kind == "off":
            notice_once('[shell] sandbox = "off": commands and launched programs run unconfined by the kernel')

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with ``TMPDIR`` (and ``TMP``, ``TEMP``) set to the private temporary folder."""
        return {**env, "TMPDIR": self.tmpdir, "TMP": self.tmpdir, "TEMP": self.tmpdir}

    def start(self, argv: Sequence[str], **popen: Any) -> Future[subprocess.Popen[bytes]]:
        """``subprocess.Popen(argv, **popen)`` confined; the future fails with OSError or ConfinementError."""
        self.check()
        kind = self.confinement.kind
        if kind == "landlock":
            return self._confined_threads().start(list(argv), popen)
        if kind == "bubblewrap":
            argv = [*self.bwrap_prefix(popen.get("cwd")), *argv]
        future: Future[subprocess.Popen[bytes]] = Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(subprocess.Popen(argv, **popen))  # noqa: S603 - the argv is the caller's
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)
        return future

    def popen(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
        """:meth:`start`, waited for (for callers that may block, e.g. in a worker thread)."""
        return self.start(argv, **popen).result()

    def _confined_threads(self) -> _ConfinedThreads:
        """The threads confined for the writable folders that exist now (new ones when that changed)."""
        writable = self.writable
        with self._lock:
            if not self._threads or self._threads[-1].writable != writable:
                if self._threads:
                    self._threads.pop().executor.shutdown(wait=False)
                self._threads.append(_ConfinedThreads(self.policy, writable))
            return self._threads[-1]

    def bwrap_prefix(self, cwd: str | os.PathLike[str] | None) -> list[str]:
        """The ``bwrap ... --`` words that put a program in this policy's bubblewrap sandbox."""
        policy = self.policy
        bwrap = self.confinement.bwrap or "bwrap"
        words = [bwrap]
        for path in policy.read:
            words += ["--ro-bind", path, path]
        # Fresh /dev (no disks) and /proc (no host process to reach through /proc/PID/fd), no capability.
        words += ["--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--cap-drop", "ALL"]
        for path in self.writable:
            words += ["--bind", path, path]
        if policy.network is not True:
            words.append("--unshare-net")
        if cwd is not None:
            words += ["--chdir", os.fspath(cwd)]
        return [*words, "--"]


def parse_network(text: str) -> bool | tuple[int, ...]:
    """``on`` -> True, ``off`` -> False, ``80,443`` -> (80, 443); an ArgumentTypeError otherwise."""
    if text in ("on", "off"):
        return text == "on"
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        import argparse  # only for a stdio server's command line

        raise argparse.ArgumentTypeError(f"must be on, off or comma-separated TCP ports, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser, what: str = "commands") -> None:
    """``--sandbox``, ``--write``, ``--read`` and ``--network``, read back by :meth:`Policy.create`."""
    parser.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default=os.environ.get("SAUCER_SHELL_SANDBOX", "auto"),
        help=f"how {what} are confined: auto (Landlock, else bubblewrap), landlock, bubblewrap, off",
    )
    parser.add_argument(
        "--write",
        action="append",
        default=[],
        metavar="DIR",
        help=f"a folder {what} may write to besides the workspace and a private TMPDIR (repeatable)",
    )
    parser.add_argument(
        "--read",
        action="append",
        default=None,
        metavar="DIR",
        help=f"a folder {what} may read (repeatable; default: the whole file system)",
    )
    parser.add_argument(
        "--network",
        type=parse_network,
        default=True,
        metavar="on|off|PORT,...",
        help=f"network of {what}: on, off (no TCP) or the TCP ports they may connect to",
    )
