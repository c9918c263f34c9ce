"""The desktop server's pure parts: keys, element ids, states, selectors, target choice, window offsets,
and the tree walk against a scripted accessibility bus (huge, cyclic and vanishing trees)."""

from __future__ import annotations

from typing import Any

import pytest
from Xlib import XK

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import STATE_NAMES, ElementGone, NodeInfo, decode_states
from saucer.tools.desktop.targets import App, choose, window_offset
from saucer.tools.desktop.tree import (
    ID_PATTERN,
    ElementRegistry,
    Located,
    Selector,
    TreeLimits,
    build_tree,
    element_id,
    find_matches,
)
from saucer.tools.desktop.x11 import XWindow, char_keysym, parse_keys

pytestmark = pytest.mark.anyio

K = XK.string_to_keysym


def test_key_combinations_parse_to_keysyms() -> None:
    assert parse_keys("ctrl+a") == [[K("Control_L"), K("a")]]
    assert parse_keys("ctrl+shift+Tab  Return") == [[K("Control_L"), K("Shift_L"), K("Tab")], [K("Return")]]
    assert parse_keys("Enter esc BACKSPACE pgdn f5 F12 super+l altgr+e") == [
        [K("Return")],
        [K("Escape")],
        [K("BackSpace")],
        [K("Next")],
        [K("F5")],
        [K("F12")],
        [K("Super_L"), K("l")],
        [K("ISO_Level3_Shift"), K("e")],
    ]
    assert parse_keys("ctrl++ + plus") == [[K("Control_L"), K("plus")], [K("plus")], [K("plus")]]
    assert parse_keys("Page_Up =") == [[K("Prior")], [ord("=")]]
    for bad, message in [("ctrl+nope", "unknown key 'nope'"), ("", "keys is empty"), ("a++b", "empty key name")]:
        with pytest.raises(DesktopError, match=message):
            parse_keys(bad)


def test_characters_map_to_keysyms() -> None:
    assert char_keysym("a") == 0x61 and char_keysym("~") == 0x7E
    assert char_keysym("×") == 0xD7  # Latin-1: the code point itself
    assert char_keysym("€") == 0x010020AC and char_keysym("√") == 0x0100221A
    assert char_keysym("\n") == K("Return") and char_keysym("\t") == K("Tab") and char_keysym(" ") == K("space")


def test_element_ids_are_stable_short_and_distinct() -> None:
    ref = (":1.42", "/org/gnome/Calculator/a11y/1de865fa_04c2_4ff8_917b_7ebcfbb97a3f")
    assert element_id(ref) == element_id(tuple(ref)) and ID_PATTERN.match(element_id(ref))
    assert element_id((":1.43", ref[1])) != element_id(ref)  # a restarted application gets new ids
    ids = {element_id((":1.1", f"/a/{n}")) for n in range(20_000)}
    assert len(ids) == 20_000


def test_registry_is_bounded_and_says_what_an_unknown_id_means() -> None:
    registry = ElementRegistry(size=3)
    keys = [registry.register(Located((":1.1", f"/{n}"), None, 7)) for n in range(5)]
    assert registry.resolve(keys[-1]).ref == (":1.1", "/4")
    with pytest.raises(DesktopError, match="unknown element id"):
        registry.resolve(keys[0])
    with pytest.raises(DesktopError, match="is not an element id"):
        registry.resolve("e123")


def test_state_bits_follow_at_spi_numbering() -> None:
    assert STATE_NAMES[23:26] == ("selected", "sensitive", "showing") and STATE_NAMES[30] == "visible"
    assert decode_states([1 << 1 | 1 << 24 | 1 << 25 | 1 << 30, 0]) == {"active", "sensitive", "showing", "visible"}
    assert decode_states([0, 1 << 10 | 1 << 11]) == {"has_popup", "read_only"}
    assert decode_states([0, 1 << 20]) == {"state_52"}


def _tree_nodes() -> dict[str, Any]:
    return {
        "id": "eroot0000",
        "role": "window",
        "name": "Calculator",
        "children": [
            {
                "id": "ebutton00",
                "role": "button",
                "name": "2 2",
                "children": [{"id": "elabel000", "role": "label", "name": "2"}],
            },
            {"id": "etext0000", "role": "text box", "name": "GtkSourceView", "text": "5"},
            {"id": "ehist0000", "role": "label", "name": "5", "text": "5"},
        ],
    }


def test_selectors_match_exactly_ignoring_case_and_spacing_or_by_regex() -> None:
    from saucer.tools.desktop.tree import Tree

    tree = Tree(root=_tree_nodes())
    ids = lambda selector: [node["id"] for node, _ in find_matches(tree, selector)]  # noqa: E731
    assert ids(Selector(name="2")) == ["elabel000"]
    assert ids(Selector(name="  2   2 ")) == ["ebutton00"]
    assert ids(Selector(name="calculator")) == ["eroot0000"]
    assert ids(Selector(text="5")) == ["etext0000", "ehist0000"]
    assert ids(Selector(role="text box", text="5")) == ["etext0000"]
    assert ids(Selector(name="re:^2")) == ["ebutton00", "elabel000"]
    [(label, ancestors)] = find_matches(tree, Selector(name="2"))
    assert label["path"] == ["window 'Calculator'", "button '2 2'"] and ancestors == ["eroot0000", "ebutton00"]
    assert "children" not in find_matches(tree, Selector(role="button"))[0][0]
    with pytest.raises(DesktopError, match="at least one"):
        Selector()
    with pytest.raises(DesktopError, match="not a valid regular expression"):
        Selector(role="re:[")


def _info(name: str, states: set[str], bounds: tuple[int, int, int, int] | None = None, bus: str = ":1.1") -> NodeInfo:
    return NodeInfo(
        ref=(bus, f"/{name}"),
        name=name,
        role="frame",
        states=frozenset(states),
        interfaces=frozenset(),
        child_count=0,
        bounds=bounds,
    )


def _xwindow(
    pid: int,
    title: str,
    x: int,
    y: int,
    w: int,
    h: int,
    focused: bool = False,
    frame: tuple[int, int, int, int] | None = None,
) -> XWindow:
    return XWindow(
        id=0x400000 + pid, title=title, app="app", pid=pid, x=x, y=y, width=w, height=h, focused=focused, frame=frame
    )


def test_choosing_the_focused_window_an_app_or_a_window() -> None:
    calc = App((":1.1", "/root"), "gnome-calculator", 100, [_info("Calculator", {"active", "showing"})])
    edit = App(
        (":1.2", "/root"),
        "gedit",
        200,
        [_info("notes.txt", {"showing"}, bus=":1.2"), _info("Find", {"showing"}, bus=":1.2")],
    )
    assert choose([calc, edit], None, None, None).window == "Calculator"
    assert choose([calc, edit], "GEDIT", None, None).window is None  # the whole application
    assert choose([calc, edit], None, "find", None).app == "gedit"
    assert choose([calc, edit], None, "notes", None).window == "notes.txt"  # a unique part of a title
    calc.windows[0].states = frozenset({"showing"})
    # No window says it is active: the X11 input focus decides, by process and title.
    assert choose([calc, edit], None, None, _xwindow(200, "Find", 0, 0, 10, 10, True)).window == "Find"
    with pytest.raises(DesktopError, match=r"no window has the focus.*gnome-calculator \['Calculator'\]"):
        choose([calc, edit], None, None, None)
    assert choose([calc], None, None, None).window == "Calculator"  # the only application showing a window
    with pytest.raises(DesktopError, match="no application named 'firefox'; there are: gedit, gnome-calculator"):
        choose([calc, edit], "firefox", None, None)
    with pytest.raises(DesktopError, match="several applications match 'g'"):
        choose([calc, edit], "g", None, None)
    with pytest.raises(DesktopError, match="no application is on the accessibility bus"):
        choose([], None, None, None)


def test_window_offsets_for_toolkits_that_report_window_relative_positions() -> None:
    gtk4 = _info("Calculator", {"showing"}, bounds=(0, 0, 355, 486))
    # GTK 4 under X11 without a window manager: 5 px of decoration margin on every side.
    assert window_offset(gtk4, 100, [_xwindow(100, "Calculator", 300, 150, 365, 496)]) == (305, 155)
    assert window_offset(gtk4, 100, [_xwindow(100, "Calculator", 300, 150, 401, 532, frame=(23, 23, 17, 29))]) == (
        323,
        167,
    )
    # The window of the same title wins over another of the same process.
    both = [_xwindow(100, "About", 0, 0, 355, 486), _xwindow(100, "Calculator", 40, 60, 355, 486)]
    assert window_offset(gtk4, 100, both) == (40, 60)
    assert window_offset(gtk4, 100, [_xwindow(999, "Calculator", 300, 150, 365, 496)]) == (0, 0)
    assert window_offset(_info("Editor", set(), bounds=(120, 80, 600, 400)), 100, both) == (0, 0)  # screen positions
    assert window_offset(gtk4, None, both) == (0, 0)


class ScriptedBus:
    """An accessibility bus answering from a table: path -> node; '/many/N' are generated leaves."""

    def __init__(self, nodes: dict[str, dict[str, Any]], many: int = 0) -> None:
        self.nodes = nodes
        self.many = many
        self.calls = 0
        self.static: dict[tuple[str, str], tuple[str, frozenset[str], int]] = {}  # what a real AtspiBus remembers

    def _node(self, path: str) -> dict[str, Any]:
        if path.startswith("/many/"):
            return {"name": f"item {path[6:]}", "role": "list item", "children": []}
        if path not in self.nodes:
            raise ElementGone(f"the element {path} no longer exists")
        return self.nodes[path]

    async def get_all(self, ref: tuple[str, str], interface: str) -> dict[str, Any]:
        self.calls += 1
        node = self._node(ref[1])
        count = self.many if node.get("many") else len(node.get("children", []))
        return {"Name": node["name"], "Description": node.get("description", ""), "ChildCount": count}

    async def call(
        self, ref: tuple[str, str], interface: str, method: str, signature: str | None = None, body: tuple = ()
    ) -> tuple:
        self.calls += 1
        node = self._node(ref[1])
        if method == "GetRoleName":
            return (node["role"],)
        if method == "GetState":
            return ([1 << 25 | 1 << 30, 0],)
        if method == "GetInterfaces":
            return (["org.a11y.atspi.Accessible", "org.a11y.atspi.Component"],)
        if method == "GetExtents":
            return (tuple(node.get("extents", (0, 0, 100, 20))),)
        if method == "GetChildren":
            return ([(":1.9", child) for child in node.get("children", [])],)
        if method == "GetChildAtIndex":
            return ((":1.9", f"/many/{body[0]}"),)
        raise AssertionError(method)

    async def call1(
        self, ref: tuple[str, str], interface: str, method: str, signature: str | None = None, body: tuple = ()
    ) -> Any:
        return (await self.call(ref, interface, method, signature, body))[0]

    async def get(self, ref: tuple[str, str], interface: str, name: str) -> Any:
        raise AssertionError(name)


async def _walk(bus: ScriptedBus, **limits: Any) -> Any:
    async def no_offset(info: NodeInfo, pid: int | None) -> tuple[int, int]:
        return (10, 20)

    options = {"max_depth": 30, "max_nodes": 500, "max_text": 100, "only_visible": True, **limits}
    return await build_tree(
        bus,
        (":1.9", "/root"),
        TreeLimits(**options),
        ElementRegistry(),
        pid=9,  # type: ignore[arg-type]
        root_is_toplevel=True,
        offset_for=no_offset,
    )


async def test_a_huge_list_is_read_only_as_far_as_the_limit() -> None:
    bus = ScriptedBus(
        {
            "/root": {"name": "w", "role": "window", "children": ["/list"]},
            "/list": {"name": "", "role": "list", "many": True},
        },
        many=10**9,
    )
    tree = await _walk(bus, max_nodes=50)
    assert tree.node_count == 50 and tree.truncated
    listing = tree.root["children"][0]
    assert listing["child_count"] == 10**9 and len(listing["children"]) == 48
    assert bus.calls < 50 * 8  # nothing is asked about the other 999,999,952 items
    assert tree.root["bounds"] == [10, 20, 100, 20] and listing["children"][0]["bounds"] == [10, 20, 100, 20]


async def test_cycles_duplicates_and_vanished_nodes_do_not_break_the_walk() -> None:
    bus = ScriptedBus(
        {
            "/root": {"name": "w", "role": "window", "children": ["/a", "/a", "/gone"]},
            "/a": {"name": "a", "role": "panel", "children": ["/root", "/b"]},
            "/b": {"name": "b", "role": "button", "children": ["/a"]},
        }
    )
    tree = await _walk(bus)
    assert tree.node_count == 3 and tree.gone == 1 and not tree.truncated
    assert [c["name"] for c in tree.root["children"]] == ["a"]
    assert [c["name"] for c in tree.root["children"][0]["children"]] == ["b"]


async def test_depth_limit_marks_where_children_were_left_out() -> None:
    bus = ScriptedBus(
        {
            "/root": {"name": "w", "role": "window", "children": ["/a"]},
            "/a": {"name": "a", "role": "panel", "children": ["/b"]},
            "/b": {"name": "b", "role": "button", "children": []},
        }
    )
    tree = await _walk(bus, max_depth=1)
    assert tree.depth_limited and tree.node_count == 2 and tree.root["children"][0]["child_count"] == 1
    assert "children" not in tree.root["children"][0]


async def test_huge_names_are_cut_and_say_so() -> None:
    bus = ScriptedBus({"/root": {"name": "w" * 5_000_000, "description": "d" * 3000, "role": "window", "children": []}})
    tree = await _walk(bus)
    assert len(tree.root["name"]) == 1000 and tree.root["name_length"] == 5_000_000
    assert len(tree.root["description"]) == 1000 and tree.root["description_length"] == 3000


async def test_on_screen_leaves_out_closed_menus_with_their_items() -> None:
    nowhere = (-2147483648, -2147483648, 1, 1)
    bus = ScriptedBus(
        {
            "/root": {"name": "w", "role": "frame", "children": ["/menu", "/tab"]},
            "/menu": {"name": "File", "role": "menu", "children": ["/open", "/recent"]},
            "/open": {"name": "Open", "role": "menu item", "extents": nowhere, "children": []},
            "/recent": {"name": "Recent", "role": "menu", "extents": nowhere, "children": ["/clear"]},
            "/clear": {"name": "Clear", "role": "menu item", "extents": nowhere, "children": []},
            "/tab": {"name": "", "role": "page tab", "extents": (-1, -1, -1, -1), "children": ["/text"]},
            "/text": {"name": "", "role": "text", "children": []},
        }
    )
    everything = await _walk(bus)
    assert everything.node_count == 7
    shown = await _walk(bus, on_screen=True)
    assert shown.node_count == 4 and shown.hidden == 2  # the menu's two items; "Clear" is never asked about
    assert [c["role"] for c in shown.root["children"]] == ["menu", "page tab"]  # no size, but its text shows
    assert shown.root["children"][1]["children"][0]["role"] == "text"


async def test_a_tree_read_again_asks_less_and_sees_what_changed() -> None:
    bus = ScriptedBus(
        {
            "/root": {"name": "w", "role": "window", "children": ["/a", "/b"]},
            "/a": {"name": "a", "role": "panel", "children": []},
            "/b": {"name": "b", "role": "button", "children": []},
        }
    )
    first = await _walk(bus)
    calls, bus.calls = bus.calls, 0
    bus.nodes["/a"]["children"] = ["/c"]  # a child appeared since: asked for although /a had none before
    bus.nodes["/c"] = {"name": "c", "role": "label", "children": []}
    again = await _walk(bus)
    assert first.node_count == 3 and again.node_count == 4
    assert [c["name"] for c in again.root["children"][0]["children"]] == ["c"]
    assert again.root["children"][1]["role"] == "button" and again.root["children"][1]["bounds"] == [10, 20, 100, 20]
    # 22 calls to read these four nodes afresh: the three known ones are not asked for role and interfaces again.
    assert (calls, bus.calls) == (16, 16)
