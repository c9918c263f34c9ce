"""What the desktop tools return (the structured content of each MCP result)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "Screenshot",
    "UITree",
    "FindResult",
    "ClickResult",
    "TypeResult",
    "KeysResult",
    "ScrollResult",
    "LaunchResult",
    "WindowInfo",
    "WindowsResult",
]


class Screenshot(BaseModel):
    """A PNG saved in the artifacts directory."""

    path: str = Field(description="Absolute path of the PNG file.")
    artifact: str = Field(description="The file's path relative to the artifacts directory.")
    width: int = Field(description="Width of the saved image in pixels (after scaling).")
    height: int = Field(description="Height of the saved image in pixels (after scaling).")
    region: list[int] = Field(description="The screen rectangle captured: [x, y, width, height].")
    screen: list[int] = Field(description="Size of the whole screen: [width, height].")


class UITree(BaseModel):
    """The accessible tree of a window or an application."""

    app: str = Field(description="Name of the application the tree belongs to.")
    pid: int | None = Field(None, description="Its process id, when the bus tells it.")
    window: str | None = Field(
        None, description="Name of the window at the root; None when the root is the application."
    )
    node_count: int = Field(description="Nodes in the tree.")
    truncated: bool = Field(description="True when max_nodes cut the tree (its deepest levels are missing).")
    depth_limited: bool = Field(description="True when nodes at max_depth have children that were left out.")
    hidden: int = Field(description="Nodes left out because they are hidden (with only_visible).")
    gone: int = Field(description="Nodes that vanished while the tree was read.")
    seconds: float = Field(description="Time taken to read the tree.")
    path: str | None = Field(None, description="Where the tree was saved as JSON (with save_as).")
    artifact: str | None = Field(None, description="That file relative to the artifacts directory.")
    tree: dict[str, Any] | None = Field(
        None,
        description="The root node: id, role, name, and when present description, text, text_length, value, "
        "states, bounds [x, y, width, height] in screen pixels, actions, child_count (when children were "
        "left out) and children.",
    )


class FindResult(BaseModel):
    """Elements that matched a selector."""

    matches: list[dict[str, Any]] = Field(
        description="Matching nodes without children, each with its path of ancestors."
    )
    node_count: int = Field(description="Nodes searched.")
    truncated: bool = Field(description="True when the search stopped at max_nodes.")
    seconds: float = Field(description="Time taken, waiting included.")


class ClickResult(BaseModel):
    """How a click was done."""

    method: str = Field(description="'action' (the element's own click/press action) or 'pointer' (a mouse click).")
    action: str | None = Field(None, description="The accessible action that was done.")
    x: int | None = Field(None, description="Where the pointer clicked (pointer clicks).")
    y: int | None = None
    button: str = "left"
    count: int = Field(1, description="Clicks (2 for a double click).")
    element: dict[str, Any] | None = Field(None, description="The element clicked (id, role, name, bounds).")
    via: dict[str, Any] | None = Field(
        None,
        description="The parent whose action did the click, when the element itself has none (e.g. a button around a label).",
    )
    locator: dict[str, Any] | None = Field(
        None,
        description="The element described for a later session: app, window, role, name, path of roles; a plan "
        "passes it back (locator=...) to find the element again when its id no longer resolves.",
    )


class TypeResult(BaseModel):
    """Text typed on the keyboard."""

    characters: int
    element: dict[str, Any] | None = Field(None, description="The element focused first, when one was given.")
    locator: dict[str, Any] | None = Field(
        None,
        description="The element described for a later session: app, window, role, name, path of roles; a plan "
        "passes it back (locator=...) to find the element again when its id no longer resolves.",
    )


class KeysResult(BaseModel):
    """Keys pressed."""

    keys: str
    combinations: int


class ScrollResult(BaseModel):
    """Wheel turns."""

    direction: str
    amount: int
    x: int
    y: int
    locator: dict[str, Any] | None = Field(
        None,
        description="The element described for a later session: app, window, role, name, path of roles; a plan "
        "passes it back (locator=...) to find the element again when its id no longer resolves.",
    )


class LaunchResult(BaseModel):
    """A started program."""

    pid: int
    command: list[str]
    running: bool = Field(description="Whether the process was still running when the call returned.")
    exit_code: int | None = Field(None, description="Its exit status when it already ended.")
    ready: bool = Field(description="True when a window of the program appeared (on the accessibility bus or X11).")
    app: str | None = Field(None, description="Its application name on the accessibility bus.")
    windows: list[str] = Field(default_factory=list, description="Titles of its windows.")
    log: str = Field(description="File receiving the program's stdout and stderr.")
    note: str | None = None


class WindowInfo(BaseModel):
    """A top-level window."""

    id: str = Field(description="X11 window id, e.g. '0x200004'.")
    title: str
    app: str = Field(description="The window's WM_CLASS class (application name).")
    pid: int | None
    bounds: list[int] = Field(description="[x, y, width, height] on the screen.")
    focused: bool


class WindowsResult(BaseModel):
    """The top-level windows, after focusing one when asked."""

    windows: list[WindowInfo]
    focused: WindowInfo | None = Field(None, description="The window that was focused by this call.")
