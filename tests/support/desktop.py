"""Helpers for the desktop server tests: the package check and the server called through the dispatcher.

The tests that need a desktop run under CI=true (.ci/run installs the Debian
packages) and fail there when a package is missing; elsewhere they skip with
the install command.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, Result
from saucer.tools.desktop.server import Desktop, DesktopOptions, build_server
from saucer.tools.desktop.virtual import missing_packages

#: Executables the tests need beyond the virtual desktop itself -> their Debian package.
APPLICATIONS = {"gnome-calculator": "gnome-calculator"}
DESKTOP_VARIABLES = (
    "DISPLAY",
    "DBUS_SESSION_BUS_ADDRESS",
    "AT_SPI_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
)


def require_packages() -> None:
    """Skip (or, under CI=true, fail) when a Debian package the desktop tests need is missing."""
    missing = missing_packages(APPLICATIONS)
    if not missing:
        return
    command = "apt-get install -y " + " ".join(missing)
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"the desktop tests need the Debian packages {', '.join(missing)} ({command}); .ci/run installs them"
        )
    pytest.skip(f"needs the Debian packages {', '.join(missing)}: {command}")


#: Keeps GTK 3 (NO_AT_BRIDGE) and GTK 4 (GTK_A11Y) programs off the accessibility bus.
OFF_THE_BUS = {"NO_AT_BRIDGE": "1", "GTK_A11Y": "none"}
EDITABLE = re.compile(r"^(e[a-z2-7]{10}) (?:text|text box|entry)\b.*\beditable\b", re.M)


@dataclass(frozen=True)
class Case:
    """An application, the name the accessibility bus gives it, and what a task types into it."""

    command: tuple[str, ...]
    app: str
    typed: str
    package: str


FOLDER = Path("/tmp/saucer-desktop-test-folder")
CASES = {
    "gnome-calculator": Case(("gnome-calculator",), "gnome-calculator", "12+30", "gnome-calculator"),
    "mousepad": Case(("mousepad",), "mousepad", "hello wörld", "mousepad"),
    "zenity": Case(
        ("zenity", "--forms", "--title=Signup", "--text=Sign up", "--add-entry=Name", "--add-entry=Email"),
        "zenity",
        "Ada Lovelace",
        "zenity",
    ),
    "thunar": Case(("thunar", str(FOLDER)), "thunar", "/usr/share/", "thunar"),  # its location bar shows FOLDER
}


def need(*programs: str) -> None:
    """Skip (or under CI=true fail) when the Debian packages of ``programs`` are missing."""
    require_packages()
    missing = sorted({p for p in programs if shutil.which(p) is None})
    if missing:
        command = "apt-get install -y " + " ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"the desktop tests need the Debian packages {', '.join(missing)} ({command}); .ci/run installs them"
            )
        pytest.skip(f"needs the Debian packages {', '.join(missing)}: {command}")


@contextlib.contextmanager
def use_environment(env: Mapping[str, str]) -> Iterator[None]:
    """Point this process's desktop variables at ``env`` (the others unset), and restore them afterwards."""
    saved = {name: os.environ.get(name) for name in DESKTOP_VARIABLES}
    for name in DESKTOP_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class DesktopTools:
    """The desktop server in this process, called through the real dispatcher."""

    def __init__(self, artifacts: Path) -> None:
        self.desktop = Desktop(DesktopOptions(artifacts=artifacts))
        self.dispatcher = LocalCommandDispatcher.from_servers({"desktop": build_server(self.desktop)}, assume_yes=True)

    async def call(self, tool: str, **parameters: object) -> Result:
        [result] = await self.dispatcher.execute_commands([Command(tool_name=f"desktop.{tool}", parameters=parameters)])
        return result

    async def ok(self, tool: str, **parameters: object) -> Any:
        result = await self.call(tool, **parameters)
        assert result.status.value == "success", result.error
        return result.result

    async def fails(self, tool: str, **parameters: object) -> str:
        result = await self.call(tool, **parameters)
        assert result.status.value == "failure", result.result
        assert result.error is not None and "Traceback" not in result.error
        return result.error

    async def aclose(self) -> None:
        """Stop the dispatcher and the server's programs (a second call does nothing)."""
        await self.dispatcher.aclose()
        await self.desktop.aclose()
