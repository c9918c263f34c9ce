"""What a model sees of the desktop, and how programs and elements are found again: pure functions, no display."""

from __future__ import annotations

from typing import Any

import pytest

from saucer.agents.treesummary import summarize_tree
from saucer.engine.uitree import replayable
from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import NodeInfo
from saucer.tools.desktop.locator import Locator, same_path, selector_name
from saucer.tools.desktop.programs import DISCARD_BUTTON, launched_windows, program_names
from saucer.tools.desktop.targets import App, choose
from saucer.tools.desktop.x11 import XWindow

NOWHERE = [-2147483648, -2147483648, 1, 1]
_ids = iter(range(10**6))


def _n(
    role: str,
    name: str = "",
    bounds: list[int] | None = None,
    states: tuple[str, ...] = ("showing", "visible"),
    children: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    node: dict[str, Any] = {"id": f"e{next(_ids):010d}", "role": role, "name": name, "states": list(states), **extra}
    if bounds is not None:
        node["bounds"] = bounds
    if children:
        node["children"] = children
    return node


def _editor(text: str) -> dict[str, Any]:
    """Mousepad as GTK 3 shows it: a menu bar whose closed menus list 150 items at G_MININT, then the text view."""
    menus = [
        _n(
            "menu",
            f"Menu {m}",
            [m * 40, 0, 40, 25],
            children=[_n("menu item", f"Item {m}.{i}", NOWHERE, ("visible", "enabled")) for i in range(25)],
        )
        for m in range(6)
    ]
    view = _n("text", "", [1, 52, 638, 425], ("showing", "visible", "editable", "focused", "multi_line"), text=text)
    tab = _n("page tab", "", [-1, -1, -1, -1], children=[_n("scroll pane", "", [0, 51, 640, 427], children=[view])])
    return _n(
        "frame",
        "Untitled 1 - Mousepad",
        [0, 0, 640, 480],
        children=[
            _n(
                "filler",
                "",
                [0, 0, 640, 480],
                children=[*menus, _n("page tab list", "", [0, 51, 640, 427], children=[tab])],
            )
        ],
    )


def test_the_summary_shows_the_text_area_with_its_text_not_closed_menus() -> None:
    summary = summarize_tree(_editor("hello wörld"), screen=[1280, 800])
    lines = summary.splitlines()
    assert lines[0].startswith("e") and "frame 'Untitled 1 - Mousepad'" in lines[0]
    assert (
        "text text='hello wörld' [1,52,638,425] focused editable" in lines[1]
    )  # the text area, right after its window
    assert not any("menu item" in line for line in lines)  # closed menus: visible, not showing, at G_MININT
    assert sum("menu 'Menu" in line for line in lines) == 6  # the menu bar itself is on the screen
    assert "page tab " not in summary  # no size; its content is still listed
    assert len(summary) < 3000 and lines[-1].startswith("(... 0 more elements not listed; ")


def test_the_summary_spends_its_budget_by_importance_and_cuts_long_text() -> None:
    labels = [_n("label", f"Note number {i}", [10, 10 + i, 200, 10], states=("visible",)) for i in range(300)]
    buttons = [
        _n("push button", "OK", [300, 700, 80, 30], states=("visible",), actions=["click"]),
        _n(
            "push button",
            "GtkButton",
            [400, 700, 80, 30],
            states=("visible",),
            actions=["click"],
            children=[
                _n(
                    "group",
                    "",
                    [400, 700, 80, 30],
                    states=("visible",),
                    children=[_n("label", "Cancel", [400, 700, 80, 30], states=("visible",))],
                )
            ],
        ),
    ]
    entry = _n("text box", "", [10, 600, 300, 30], states=("visible", "editable"), text="x" * 5000, text_length=9000)
    off = _n("push button", "Beyond", [1300, 10, 80, 30], states=("visible",), actions=["click"])
    tree = _n(
        "window",
        "Form",
        [0, 0, 1280, 800],
        states=("showing", "visible"),
        children=[_n("panel", "", [0, 0, 1280, 800], states=("visible",), children=[*labels, *buttons, off]), entry],
    )
    summary = summarize_tree(tree, screen=[1280, 800], max_lines=40)
    lines = summary.splitlines()
    assert len(lines) == 41 and len(summary) <= 3100
    assert "text box text='" in lines[1] and "(9000 characters)" in lines[1] and len(lines[1]) < 800
    assert "push button 'OK'" in lines[2] and "push button 'Cancel'" in lines[3]  # the label inside names the button
    assert "Beyond" not in summary and "GtkButton" not in summary  # off the screen; a toolkit class name
    assert "label 'Note number 0'" in lines[4]
    assert lines[-1].startswith("(... ")


def test_an_application_tree_lists_its_active_window_first() -> None:
    first = _n(
        "frame", "Other", [0, 0, 100, 100], children=[_n("push button", "Old", [0, 0, 50, 20], actions=["click"])]
    )
    second = _n(
        "dialog",
        "Save?",
        [0, 0, 100, 100],
        ("showing", "visible", "active"),
        children=[_n("push button", "Don't Save", [0, 0, 50, 20], actions=["click"])],
    )
    summary = summarize_tree(_n("application", "editor", children=[first, second]))
    order = [line.split(" ", 1)[1] for line in summary.splitlines() if not line.startswith("(")]
    assert order[:3] == ["application 'editor'", "dialog 'Save?' [0,0,100,100]", "frame 'Other' [0,0,100,100]"]
    assert order.index('push button "Don\'t Save" [0,0,50,20]') < order.index("push button 'Old' [0,0,50,20]")


def _x(wid: int, title: str, pid: int | None, cls: str = "App", instance: str = "app") -> XWindow:
    return XWindow(
        id=wid,
        title=title,
        app=cls,
        pid=pid,
        x=0,
        y=0,
        width=10,
        height=10,
        focused=False,
        frame=None,
        instance=instance,
    )


def test_windows_of_a_launched_program_by_pid_or_by_name_when_new() -> None:
    windows = [
        _x(1, "old xmessage", None, "Xmessage", "xmessage"),
        _x(2, "xmessage", None, "Xmessage", "xmessage"),
        _x(3, "Calculator", 40),
        _x(4, "Other", 99),
        _x(5, "report - Viewer", None, "Viewer", "viewer"),
    ]
    names = program_names(["/usr/bin/xmessage", "hi"])
    assert names == {"xmessage"}
    # A window of its process; a new window named after it (no _NET_WM_PID); never an older one of that name.
    assert [w.id for w in launched_windows(windows, {40}, {1, 3, 4, 5}, names)] == [2, 3]
    assert [w.id for w in launched_windows(windows, set(), {1, 2, 3, 4}, {"viewer"})] == [5]


def test_the_discard_button_of_a_save_question() -> None:
    assert all(DISCARD_BUTTON.match(n) for n in ("Don't Save", "Don’t Save", "Close without Saving", "Discard"))
    assert not any(DISCARD_BUTTON.match(n) for n in ("Save", "Cancel", "Save As…", "No"))


def test_a_focused_window_that_is_not_on_the_bus_is_said_so() -> None:
    info = NodeInfo(
        ref=(":1.1", "/w"),
        name="Untitled 1 - Mousepad",
        role="frame",
        states=frozenset({"showing"}),
        interfaces=frozenset(),
        child_count=0,
    )
    apps = [App((":1.1", "/root"), "mousepad", 10, [info])]
    with pytest.raises(
        DesktopError, match=r"the focused window 'zenity' \(Zenity, pid 77\) is not on the accessibility bus"
    ):
        choose(apps, None, None, _x(9, "zenity", 77, "Zenity", "zenity"))
    assert choose(apps, None, None, _x(8, "Untitled 1 - Mousepad", 10)).app == "mousepad"
    # No application on the bus at all (the only program runs with NO_AT_BRIDGE=1): still the focused window's case.
    with pytest.raises(
        DesktopError, match=r"the focused window 'zenity' \(Zenity, pid 77\) is not on the accessibility bus"
    ):
        choose([], None, None, _x(9, "zenity", 77, "Zenity", "zenity"))
    with pytest.raises(DesktopError, match="no application is on the accessibility bus; start one first"):
        choose([], "zenity", None, _x(9, "zenity", 77, "Zenity", "zenity"))  # app= named: there is none
    apps.append(App((":1.2", "/root"), "zenity", 77, []))  # on the bus, no window listed yet: the application
    assert choose(apps, None, None, _x(9, "zenity", 77, "Zenity", "zenity")).window is None
    assert choose(apps, None, None, None).app == "mousepad"  # no focus at all: the only application showing


def test_a_saved_plan_keeps_the_locator_beside_the_id() -> None:
    locator = {"app": "mousepad", "window": "Untitled 1 - Mousepad", "role": "text", "name": "", "path": ["frame"]}
    command = {"tool_name": "desktop.type_text", "parameters": {"text": "hi", "element_id": "eabcdefghij"}}
    kept = replayable(command, {"status": "success", "result": {"characters": 2, "locator": locator}})
    assert kept["parameters"] == {"text": "hi", "element_id": "eabcdefghij", "locator": locator}
    assert command["parameters"] == {"text": "hi", "element_id": "eabcdefghij"}  # the record itself is unchanged
    assert replayable(
        {"tool_name": "desktop.press_keys", "parameters": {"keys": "a"}}, {"result": {"locator": locator}}
    ) == {"tool_name": "desktop.press_keys", "parameters": {"keys": "a"}}  # no element id: nothing to find again
    other = {"tool_name": "shell.run", "parameters": {"element_id": "x"}}
    assert replayable(other, {"result": {"locator": locator}}) is other


def test_a_locator_prefers_the_same_path_of_roles() -> None:
    nodes = {
        "w": {"role": "frame"},
        "a": {"role": "panel"},
        "b": {"role": "scroll pane"},
        "app": {"role": "application"},
    }
    in_panel, in_scroll = ({"id": "x1"}, ["w", "a"]), ({"id": "x2"}, ["w", "b"])
    wanted = Locator(app="mousepad", window="W", role="text", path=["frame", "scroll pane"])
    assert same_path(wanted, [in_panel, in_scroll], nodes, False) == [in_scroll]
    assert same_path(wanted, [({"id": "x3"}, ["app", "w", "b"])], nodes, True)[0][0]["id"] == "x3"
    assert same_path(wanted, [in_panel], nodes, False) == [in_panel]  # none on that path: every match
    assert selector_name("re:literal") == r"re:^re:literal$" and selector_name("Name") == "Name"
