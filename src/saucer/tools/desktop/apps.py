"""Programs started by ``launch``: each in its own process group, logged to a file, stopped with the server."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from saucer.tools.confine import ConfinementError, Confiner, Policy
from saucer.tools.desktop import DesktopError

__all__ = ["Launcher", "split_command"]

_STOP_GRACE = 2.0
_LOG_TAIL = 1500


def split_command(command: str | Sequence[str]) -> list[str]:
    """A command line (split like a POSIX shell would, without running one) or an argument list."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise DesktopError(f"cannot parse the command {command!r}: {exc}") from None
    else:
        argv = [str(part) for part in command]
    if not argv or not argv[0].strip():
        raise DesktopError("command is empty: give a program to start, e.g. 'gnome-calculator'")
    if any("\x00" in part for part in argv):
        raise DesktopError("the command contains a NUL byte")
    return argv


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc; empty where /proc has no children lists)."""
    found, todo = {pid}, [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                for child in task.read_text().split():
                    if int(child) not in found:
                        found.add(int(child))
                        todo.append(int(child))
    return found


class Launcher:
    """Starts programs confined by ``policy`` (:mod:`saucer.tools.confine`) and stops the ones still running
    when the server ends."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        #: X11 windows found as the started programs' own (see :mod:`saucer.tools.desktop.programs`).
        self.windows: set[int] = set()
        self.policy = policy or Policy.create("auto", (Path.cwd(),), scoped=False)
        self._confiner: Confiner | None = None

    @property
    def confiner(self) -> Confiner:
        """The confiner of :attr:`policy`, made at the first launch (its private TMPDIR with it)."""
        if self._confiner is None:
            self._confiner = Confiner(self.policy)
        return self._confiner

    def start(
        self, argv: list[str], *, cwd: Path, env: Mapping[str, str], log: Callable[[], BinaryIO]
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a new session with stdout and stderr appended to the file ``log()`` opens
        (:meth:`saucer.tools.desktop.artifacts.Artifacts.open_log`: through the folder's descriptor)."""
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            raise DesktopError(f"program {argv[0]!r} not found (not on PATH and not an executable file)")
        with log() as out:
            try:
                proc = self.confiner.popen(  # the user approved this command (launch is sensitive)
                    argv,
                    cwd=cwd,
                    env=self.confiner.environment(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except (OSError, ConfinementError) as exc:
                raise DesktopError(f"could not start {argv[0]!r}: {exc}") from None
        self.processes.append(proc)
        return proc

    @staticmethod
    def log_tail(log: Path) -> str:
        with contextlib.suppress(OSError):
            data = log.read_bytes()[-_LOG_TAIL:]
            return data.decode("utf-8", "replace").strip()
        return ""

    def stop_all(self) -> None:
        """SIGTERM every started process group still alive, then SIGKILL what is left after a grace period.

        :func:`saucer.tools.desktop.programs.close_programs` asks the programs to close before this."""
        alive = [p for p in self.processes if p.poll() is None]
        for proc in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if p.poll() is None]
            time.sleep(0.02)
        for proc in self.processes:
            # The group outlives its leader: members that ignored SIGTERM still get the kill.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        self.processes.clear()
        self.windows.clear()
