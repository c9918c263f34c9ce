"""A private virtual desktop: Xvfb on a free display plus its own D-Bus session bus (AT-SPI starts on demand).

For tests, benchmarks and headless runs in Python::

    with VirtualDesktop() as desktop:
        subprocess.run(["saucer", "run", "--plan", "plan.json"], env={**os.environ, **desktop.env})

From a shell, Debian's ``xvfb-run -a dbus-run-session -- COMMAND`` does the
same. The session bus gets a private ``XDG_RUNTIME_DIR``, so the
accessibility bus that at-spi2-core starts for it has its own socket and two
virtual desktops on one machine never share (or remove) each other's.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from saucer.tools.desktop import DesktopError

__all__ = ["VirtualDesktop", "missing_packages"]

_BUS_LAUNCHERS = ("/usr/libexec/at-spi-bus-launcher", "/usr/lib/at-spi2-core/at-spi-bus-launcher")
_START_TIMEOUT = 15.0


def missing_packages(programs: dict[str, str] | None = None) -> list[str]:
    """The Debian packages a virtual desktop needs that are not installed (plus those of ``programs``:
    executable -> package)."""
    needed = {"Xvfb": "xvfb", "dbus-daemon": "dbus", **(programs or {})}
    missing = [package for program, package in needed.items() if shutil.which(program) is None]
    if not any(os.access(path, os.X_OK) for path in _BUS_LAUNCHERS) and shutil.which("at-spi-bus-launcher") is None:
        missing.append("at-spi2-core")
    return sorted(set(missing))


def _read_line(stream: int, what: str, proc: subprocess.Popen[bytes]) -> str:
    """One line from a pipe, within the start timeout."""
    deadline = time.monotonic() + _START_TIMEOUT
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise DesktopError(f"{what} did not start within {_START_TIMEOUT:g} s")
        ready, _, _ = select.select([stream], [], [], min(left, 0.2))
        if ready:
            chunk = os.read(stream, 256)
            if not chunk:
                raise DesktopError(f"{what} exited before it was ready (status {proc.wait()})")
            data += chunk
    return data.decode().strip()


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    # Services the bus started on demand (the accessibility bus and registry) are in its group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class VirtualDesktop:
    """Xvfb (``-displayfd`` picks a free display) and a ``dbus-daemon --session``; :attr:`env` reaches both."""

    def __init__(self, width: int = 1280, height: int = 800, depth: int = 24, *, private_home: bool = False) -> None:
        self.size = (width, height, depth)
        #: Give the programs (and the bus's services, such as dconf) their own XDG config, data and cache
        #: folders, so that nothing they save reaches the user's, or the next virtual desktop's.
        self.private_home = private_home
        self.env: dict[str, str] = {}
        self.display = ""
        self._dir: Path | None = None
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._bus: subprocess.Popen[bytes] | None = None

    def start(self) -> VirtualDesktop:
        """Start the display and the bus; :class:`DesktopError` names the missing Debian packages."""
        missing = missing_packages()
        if missing:
            raise DesktopError(
                f"a virtual desktop needs the Debian packages {', '.join(missing)}: "
                f"apt-get install -y {' '.join(missing)}"
            )
        self._dir = Path(tempfile.mkdtemp(prefix="saucer-desktop-"))
        try:
            self._start_display()
            self._start_bus()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_display(self) -> None:
        width, height, depth = self.size
        read_end, write_end = os.pipe()
        try:
            self._xvfb = subprocess.Popen(
                [
                    "Xvfb",
                    "-displayfd",
                    str(write_end),
                    "-screen",
                    "0",
                    f"{width}x{height}x{depth}",
                    "-nolisten",
                    "tcp",
                    "-noreset",
                ],
                pass_fds=(write_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            os.close(write_end)
            write_end = -1
            self.display = ":" + _read_line(read_end, "Xvfb", self._xvfb)
        finally:
            os.close(read_end)
            if write_end != -1:
                os.close(write_end)

    def _start_bus(self) -> None:
        assert self._dir is not None
        homes = {}
        if self.private_home:
            homes = {
                name: str(self._dir / folder)
                for name, folder in (
                    ("XDG_CONFIG_HOME", "config"),
                    ("XDG_DATA_HOME", "data"),
                    ("XDG_CACHE_HOME", "cache"),
                )
            }
        env = {**os.environ, "DISPLAY": self.display, "XDG_RUNTIME_DIR": str(self._dir), **homes}
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        env.pop("AT_SPI_BUS_ADDRESS", None)
        self._bus = subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._bus.stdout is not None
        address = _read_line(self._bus.stdout.fileno(), "dbus-daemon", self._bus)
        self.env = {
            "DISPLAY": self.display,
            "DBUS_SESSION_BUS_ADDRESS": address,
            "XDG_RUNTIME_DIR": str(self._dir),
            **homes,
        }

    def stop(self) -> None:
        """Stop the bus (and what it started), then the display; remove the private runtime directory."""
        _stop(self._bus)
        if self._bus is not None and self._bus.stdout is not None:
            self._bus.stdout.close()
        _stop(self._xvfb)
        self._bus = self._xvfb = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> VirtualDesktop:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
