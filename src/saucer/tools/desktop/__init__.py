"""The built-in ``desktop`` MCP server: screenshots, UI trees, mouse and keyboard on a Linux X11 desktop.

Run it over stdio with ``python -m saucer.tools.desktop [--artifacts DIR]``
(``--help`` lists the options). It needs an X11 display (``DISPLAY``, e.g. a
virtual one from Xvfb) and, for the UI tree, the AT-SPI accessibility bus
(at-spi2-core, reached through the D-Bus session bus). On Debian::

    apt-get install -y xvfb at-spi2-core dbus

The Python side needs the ``desktop`` extra (``pip install 'saucer[desktop]'``:
dbus-fast, python-xlib, Pillow). The tools are ``screenshot``, ``ui_tree``,
``find``, ``click``, ``type_text``, ``press_keys``, ``scroll``, ``launch`` and
``windows``; see :mod:`saucer.tools.desktop.server`.

This module itself imports nothing heavy: the dispatcher reads the constants
below to configure the server without loading X11 or D-Bus code.
"""

from __future__ import annotations

import os

__all__ = [
    "DEFAULT_SENSITIVE_TOOLS",
    "DEBIAN_PACKAGES",
    "INSTALL_HINT",
    "PYTHON_HINT",
    "PASSED_ENVIRONMENT",
    "DesktopError",
    "desktop_environment",
]

#: Tools of this server that need the user's approval unless configured otherwise:
#: ``launch`` starts an arbitrary program.
DEFAULT_SENSITIVE_TOOLS: tuple[str, ...] = ("launch",)

#: The Debian packages the server needs on a machine without a desktop session.
DEBIAN_PACKAGES: tuple[str, ...] = ("xvfb", "at-spi2-core", "dbus")
INSTALL_HINT = "apt-get install -y " + " ".join(DEBIAN_PACKAGES)
PYTHON_HINT = "pip install 'saucer[desktop]' (dbus-fast, python-xlib, pillow)"

#: Variables a desktop program needs, passed from saucer to the server (an MCP
#: stdio server inherits only HOME, PATH, USER and a few others).
PASSED_ENVIRONMENT: tuple[str, ...] = (
    "DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    "AT_SPI_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "XDG_DATA_DIRS",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_MESSAGES",
)


class DesktopError(Exception):
    """A desktop action could not be done; the message says why and what to do (one sentence or two)."""


def desktop_environment(display: str | None = None) -> dict[str, str]:
    """The desktop variables of this process (``DISPLAY`` replaced by ``display`` when given)."""
    env = {name: os.environ[name] for name in PASSED_ENVIRONMENT if os.environ.get(name)}
    if display:
        env["DISPLAY"] = display
    return env
