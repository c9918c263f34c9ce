"""The ``desktop`` MCP server: its tools, options and entry point.

Tools (all answers are structured JSON; failures are tool errors saying what to do):

``screenshot(region=None, scale=None, name=None)``
    A PNG of the screen (or of ``region`` = [x, y, width, height], optionally
    scaled) saved in the artifacts directory; returns its path and size.
``ui_tree(app=None, window=None, max_depth=30, max_nodes=500, max_text=200, only_visible=True, on_screen=False, save_as=None, include_tree=True)``
    The accessible tree of the focused window, of ``window`` (title) or of
    ``app`` (application name), with stable element ids; ``save_as`` also
    writes it as JSON to the artifacts directory.
``find(name=None, role=None, text=None, app=None, window=None, timeout=0, max_nodes=5000)``
    Elements matching a selector, waiting up to ``timeout`` seconds for one
    to appear; an error when none does.
``click(element_id=None | name/role/text selector | x, y, button='left', double=False, method='auto')``
    The element's own ``click``/``press`` action when it has one, else a
    pointer click at the centre of its bounds; or a click at (x, y).
``type_text(text, element_id=None, delay=0)``, ``press_keys(keys, delay=0)``, ``scroll(direction, amount, ...)``
    Keyboard and wheel input through XTEST.
``launch(command, wait=10, env=None)``
    Start a program (sensitive: the dispatcher asks first) and wait for its window.
``windows(focus=None)``
    The top-level windows; ``focus`` (an id or a title) raises and focuses one.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from saucer.tools._common import env_default, make_server, parse, positive_float, positive_int, serve_stdio
from saucer.tools.confine import Policy, add_arguments
from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.core import Desktop, DesktopOptions
from saucer.tools.desktop.locator import Locator
from saucer.tools.desktop.models import (
    ClickResult,
    FindResult,
    KeysResult,
    LaunchResult,
    Screenshot,
    ScrollResult,
    TypeResult,
    UITree,
    WindowsResult,
)
from saucer.tools.desktop.tree import Selector

__all__ = ["build_server", "parse_options", "main", "DesktopOptions", "Desktop"]

logger = logging.getLogger("saucer.tools.desktop")
T = TypeVar("T")

DEFAULT_ARTIFACTS = "artifacts"
#: ui_tree's default limits (lowered to the server's --max-depth and --max-nodes when those are lower).
TREE_DEPTH = 30
TREE_NODES = 500
# Looking changes nothing on the desktop (a screenshot or a saved tree is a new file in the artifacts folder).
_OBSERVE = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
_INPUT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)


async def _guard(call: Awaitable[T]) -> T:
    """Run one tool call; every failure becomes a tool error with a message, never an exception in the server."""
    try:
        return await call
    except DesktopError as exc:
        raise ToolError(str(exc)) from None
    except ToolError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug must still answer the call, with its cause
        logger.exception("desktop tool failed")
        raise ToolError(f"unexpected {type(exc).__name__}: {exc}") from None


def _selector(name: str | None, role: str | None, text: str | None) -> Selector | None:
    if name is None and role is None and text is None:
        return None
    return Selector(name=name, role=role, text=text)


def _one_target(element_id: str | None, selector: Selector | None, x: int | None, y: int | None) -> None:
    if (x is None) != (y is None):
        raise DesktopError("give both x and y, or neither")
    given = [
        what
        for what, present in (
            ("element_id", element_id is not None),
            ("name/role/text", selector is not None),
            ("x and y", x is not None),
        )
        if present
    ]
    if len(given) != 1:
        raise DesktopError(
            "say what to click with exactly one of: element_id (from ui_tree or find), name/role/text, or x and y"
            + (f" (got {' and '.join(given)})" if given else "")
        )


Name = Annotated[str | None, Field(description="Element name: equal ignoring case and spacing, or 're:REGEX'.")]
Role = Annotated[str | None, Field(description="Element role, e.g. 'button', 'text', 'label' (or 're:REGEX').")]
Text = Annotated[str | None, Field(description="Element text content (Text interface), equal or 're:REGEX'.")]
App = Annotated[
    str | None, Field(description="Application name, e.g. 'gnome-calculator' (default: the focused window's).")
]
Window = Annotated[str | None, Field(description="Window title (default: the focused window).")]
ElementId = Annotated[str | None, Field(description="An element id from ui_tree or find, e.g. 'e3kqx7mab2c'.")]
Where = Annotated[
    Locator | None,
    Field(
        description="The element's locator from an earlier result (plans): used when "
        "element_id does not resolve, e.g. in a new session."
    ),
]


def build_server(desktop: Desktop) -> MCPServer:
    """The desktop MCP server working on ``desktop`` (the caller closes it with ``await desktop.aclose()``)."""
    options = desktop.options
    server = make_server(
        "saucer-desktop",
        instructions="Sees and drives a Linux X11 desktop: screenshots, accessible UI trees, mouse and keyboard. "
        f"Screenshots and saved trees go to {options.artifacts}.",
    )

    async def screenshot(
        region: Annotated[
            list[int] | None,
            Field(
                min_length=4,
                max_length=4,
                description="[x, y, width, height] in screen pixels (default: the whole screen).",
            ),
        ] = None,
        scale: Annotated[float | None, Field(gt=0, le=4, description="Resize factor, e.g. 0.5 for half size.")] = None,
        name: Annotated[
            str | None, Field(description="File name inside the artifacts directory (default: screenshot-TIME.png).")
        ] = None,
    ) -> Screenshot:
        return await _guard(desktop.screenshot(region, scale, name))

    async def ui_tree(
        app: App = None,
        window: Window = None,
        max_depth: Annotated[
            int | None, Field(description=f"Levels below the root to read (default {TREE_DEPTH}).")
        ] = None,
        max_nodes: Annotated[
            int | None,
            Field(
                description=f"Most nodes to return (default {TREE_NODES}; breadth first: deep levels are cut first)."
            ),
        ] = None,
        max_text: Annotated[int, Field(description="Most characters of text per node.")] = 200,
        only_visible: Annotated[
            bool, Field(description="Leave out hidden elements (neither showing nor visible) and their children.")
        ] = True,
        on_screen: Annotated[
            bool,
            Field(
                description="Also leave out elements placed entirely off the screen (such as "
                "the items of closed menus) and their children."
            ),
        ] = False,
        save_as: Annotated[
            str | None, Field(description="Also save the tree as JSON under this name in the artifacts directory.")
        ] = None,
        include_tree: Annotated[
            bool, Field(description="Return the tree itself (false: only counts and the saved path).")
        ] = True,
    ) -> UITree:
        async def run() -> UITree:
            limits = desktop.limits(
                min(TREE_DEPTH, options.max_depth) if max_depth is None else max_depth,
                min(TREE_NODES, options.max_nodes) if max_nodes is None else max_nodes,
                max_text,
                only_visible,
                on_screen,
            )
            return await desktop.ui_tree(app, window, limits, save_as, include_tree)

        return await _guard(run())

    async def find(
        name: Name = None,
        role: Role = None,
        text: Text = None,
        app: App = None,
        window: Window = None,
        timeout: Annotated[float, Field(description="Seconds to wait for a match to appear (0: look once).")] = 0.0,
        max_nodes: Annotated[
            int | None, Field(description="Most nodes to search (default: the server's --max-nodes).")
        ] = None,
    ) -> FindResult:
        async def run() -> FindResult:
            selector = _selector(name, role, text) or Selector()
            return await desktop.find(
                selector, app, window, timeout, options.max_nodes if max_nodes is None else max_nodes
            )

        return await _guard(run())

    async def click(
        element_id: ElementId = None,
        name: Name = None,
        role: Role = None,
        text: Text = None,
        app: App = None,
        window: Window = None,
        index: Annotated[
            int | None, Field(ge=0, description="Which match (0-based) when several elements match.")
        ] = None,
        x: Annotated[int | None, Field(description="Screen x to click at (with y, instead of an element).")] = None,
        y: Annotated[int | None, Field(description="Screen y to click at.")] = None,
        button: Literal["left", "middle", "right"] = "left",
        double: Annotated[bool, Field(description="Double click (always a pointer click).")] = False,
        method: Annotated[
            Literal["auto", "action", "pointer"],
            Field(
                description="auto: the element's click/press action when it has one, else the pointer; "
                "action: only the action; pointer: always a mouse click at the element's centre."
            ),
        ] = "auto",
        locator: Where = None,
    ) -> ClickResult:
        async def run() -> ClickResult:
            selector = _selector(name, role, text)
            _one_target(element_id, selector, x, y)
            return await desktop.click(
                element_id=element_id,
                selector=selector,
                app=app,
                window=window,
                index=index,
                x=x,
                y=y,
                button=button,
                double=double,
                method=method,
                locator=locator,
            )

        return await _guard(run())

    async def type_text(
        text: Annotated[str, Field(description="The text to type; \\n presses Return and \\t Tab.")],
        element_id: Annotated[
            str | None, Field(description="Focus this element first (else: type where the focus is).")
        ] = None,
        delay: Annotated[float, Field(ge=0, le=1, description="Seconds between keys.")] = 0.0,
        locator: Where = None,
    ) -> TypeResult:
        return await _guard(desktop.type_text(text, element_id, delay, locator))

    async def press_keys(
        keys: Annotated[
            str,
            Field(
                description="Key combinations separated by spaces, e.g. 'ctrl+a', 'Return', "
                "'ctrl+a BackSpace', 'alt+F4', 'shift+Tab'."
            ),
        ],
        delay: Annotated[float, Field(ge=0, le=1, description="Seconds between combinations.")] = 0.0,
    ) -> KeysResult:
        return await _guard(desktop.press_keys(keys, delay))

    async def scroll(
        direction: Literal["up", "down", "left", "right"] = "down",
        amount: Annotated[int, Field(ge=1, le=100, description="Wheel notches.")] = 3,
        element_id: Annotated[str | None, Field(description="Scroll over this element (its centre).")] = None,
        x: Annotated[int | None, Field(description="Screen x to scroll at (default: where the pointer is).")] = None,
        y: Annotated[int | None, Field(description="Screen y to scroll at.")] = None,
        locator: Where = None,
    ) -> ScrollResult:
        async def run() -> ScrollResult:
            if (x is None) != (y is None):
                raise DesktopError("give both x and y, or neither")
            if element_id is not None and x is not None:
                raise DesktopError("give element_id or x and y, not both")
            return await desktop.scroll(direction, amount, element_id, x, y, locator)

        return await _guard(run())

    async def launch(
        command: Annotated[
            str | list[str],
            Field(
                description="The program and its arguments: a command line "
                "(split like a shell would, but no shell runs it) or a list."
            ),
        ],
        wait: Annotated[float, Field(description="Seconds to wait for its first window.")] = 10.0,
        env: Annotated[dict[str, str] | None, Field(description="Extra environment variables.")] = None,
    ) -> LaunchResult:
        return await _guard(desktop.launch(command, wait, env))

    async def windows(
        focus: Annotated[
            str | None, Field(description="Raise and focus this window: its id (e.g. '0x200004') or title.")
        ] = None,
    ) -> WindowsResult:
        return await _guard(desktop.windows(focus))

    server.add_tool(
        screenshot,
        name="screenshot",
        title="Take a screenshot",
        annotations=_OBSERVE,
        description="Capture the screen (or a region) as a PNG saved in the artifacts directory "
        f"({options.artifacts}); returns the file's path and its width and height in pixels.",
    )
    server.add_tool(
        ui_tree,
        name="ui_tree",
        title="Read the UI tree",
        annotations=_OBSERVE,
        description="The accessible tree (AT-SPI) of the focused window, of a window by title, or of a whole "
        "application by name: each element has an id (stable while the element lives; use it with click, "
        "type_text and scroll), role, name, text, value, states and bounds [x, y, width, height] in screen "
        f"pixels. Limits: max_depth <= {options.max_depth}, max_nodes <= {options.max_nodes}.",
    )
    server.add_tool(
        find,
        name="find",
        title="Find elements",
        annotations=_OBSERVE,
        description="Elements of the focused window (or of app/window) whose name, role and/or text match; "
        "set timeout to wait for one to appear. Fails when nothing matches, so a plan can check that a text "
        "is shown, e.g. find(text='5', timeout=5).",
    )
    server.add_tool(
        click,
        name="click",
        title="Click",
        annotations=_INPUT,
        description="Click an element (by element_id, or by name/role/text in the focused window) or a screen "
        "point (x, y). An element's own click/press action is used when it has one, else a mouse click at "
        "the centre of its bounds.",
    )
    server.add_tool(
        type_text,
        name="type_text",
        title="Type text",
        annotations=_INPUT,
        description="Type text on the keyboard into the focused element (or focus element_id first).",
    )
    server.add_tool(
        press_keys,
        name="press_keys",
        title="Press keys",
        annotations=_INPUT,
        description="Press key combinations such as 'ctrl+a', 'Return', 'Escape', 'alt+F4' or several "
        "separated by spaces ('ctrl+a BackSpace'). Key names are X11 names (Return, Tab, BackSpace, Delete, "
        "Left, Page_Up, F5, a) or enter, esc, ctrl, shift, alt, super, pgup, pgdn; the plus key is 'plus'.",
    )
    server.add_tool(
        scroll,
        name="scroll",
        title="Scroll",
        annotations=_INPUT,
        description="Turn the mouse wheel over an element, a point, or where the pointer is.",
    )
    server.add_tool(
        launch,
        name="launch",
        title="Start a program",
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=True),
        description="Start a desktop program (e.g. 'gnome-calculator') and wait until its window appears. "
        "It runs until the session ends (then it is stopped); its output goes to a log file in the artifacts "
        "directory.",
    )
    server.add_tool(
        windows,
        name="windows",
        title="List or focus windows",
        annotations=_INPUT,
        description="The top-level windows (id, title, application, pid, bounds, focused); with focus, raise "
        "and focus one of them first.",
    )
    return server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m saucer.tools.desktop",
        description="saucer's desktop MCP server over stdio: screenshots, accessible UI trees (AT-SPI), mouse "
        "and keyboard (XTEST) on an X11 display.",
        epilog="It needs DISPLAY and a D-Bus session bus with at-spi2-core (Debian: apt-get install -y xvfb "
        "at-spi2-core dbus). Environment variables: SAUCER_DESKTOP_ARTIFACTS, SAUCER_DESKTOP_DISPLAY.",
    )
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=Path(env_default("SAUCER_DESKTOP_ARTIFACTS", DEFAULT_ARTIFACTS)),
        help="directory for screenshots, saved trees and program logs; created when needed "
        f"(default: ./{DEFAULT_ARTIFACTS})",
    )
    parser.add_argument(
        "--display",
        default=env_default("SAUCER_DESKTOP_DISPLAY"),
        help="X display to use, e.g. :99 (default: $DISPLAY)",
    )
    parser.add_argument(
        "--max-nodes", type=positive_int, default=5000, help="largest max_nodes a call may ask for (default 5000)"
    )
    parser.add_argument(
        "--max-depth", type=positive_int, default=100, help="largest max_depth a call may ask for (default 100)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=5.0,
        metavar="S",
        help="seconds an application may take to answer one accessibility call (default 5)",
    )
    parser.add_argument(
        "--max-wait",
        type=positive_float,
        default=120.0,
        metavar="S",
        help="largest wait/timeout of launch and find (default 120)",
    )
    parser.add_argument(
        "--keep-apps", action="store_true", help="leave the programs started by launch running when the server stops"
    )
    add_arguments(parser, "launched programs")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> DesktopOptions:
    """Options from ``argv`` and ``SAUCER_DESKTOP_*`` variables."""
    args = parse(_parser(), argv)
    return DesktopOptions(
        artifacts=args.artifacts.expanduser().absolute(),
        display=args.display,
        max_nodes=args.max_nodes,
        max_depth=args.max_depth,
        call_timeout=args.timeout,
        max_wait=args.max_wait,
        keep_apps=args.keep_apps,
        # Writable: the working directory (the workspace) and the artifacts; GUI programs need abstract sockets.
        policy=Policy.create(
            args.sandbox,
            (Path.cwd(), args.artifacts.expanduser().absolute(), *args.write),
            args.read or ("/",),
            args.network,
            scoped=False,
        ),
    )


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the desktop tools over stdio until the client closes the connection; then stop launched programs."""
    desktop = Desktop(parse_options(argv))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return serve_stdio(lambda: build_server(desktop), "saucer-desktop")
    finally:
        if not desktop.options.keep_apps:
            desktop.stop_programs()


if __name__ == "__main__":
    sys.exit(main())
