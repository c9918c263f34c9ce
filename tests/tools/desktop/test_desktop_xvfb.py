"""The desktop server on a real display: Xvfb, a private D-Bus and AT-SPI bus, and GNOME Calculator (GTK 4).

Screenshots are compared with what is on the screen, clicks and keys are
checked by what the calculator shows afterwards, and the input events are
read back by a window of the test's own.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageStat
from tests.support.desktop import DesktopTools
from Xlib import XK, X, display

from saucer.tools.desktop.atspi import AtspiBus, find_bus_address
from saucer.tools.desktop.targets import list_apps
from saucer.tools.desktop.tree import ID_PATTERN
from saucer.tools.desktop.virtual import VirtualDesktop

pytestmark = pytest.mark.anyio

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


async def _wait_for_app(name: str, timeout: float = 60) -> None:
    bus = await AtspiBus.connect(await find_bus_address(None, 5), 5)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            apps = await list_apps(bus)
            if any(a.name == name and any("showing" in w.states for w in a.windows) for a in apps):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{name} did not show a window within {timeout} s")
    finally:
        await bus.close()


@pytest.fixture(scope="module")
def calculator(virtual_desktop: VirtualDesktop, desktop_env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """GNOME Calculator on the virtual desktop, for the whole module."""
    proc = subprocess.Popen(
        ["gnome-calculator"],
        env={**os.environ, **desktop_env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        asyncio.run(_wait_for_app("gnome-calculator"))
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("children", ()):
        yield from _nodes(child)


async def _display_shows(tools: DesktopTools, text: str) -> None:
    """The calculator's entry (a text box) shows ``text``: read from the tree, waiting up to 10 s."""
    found = await tools.ok("find", role="text box", text=text, app="gnome-calculator", timeout=10)
    assert found["matches"][0]["text"] == text


async def _clear(tools: DesktopTools) -> None:
    await tools.ok("windows", focus="Calculator")
    await tools.ok("press_keys", keys="Escape")


async def test_screenshots_are_pngs_of_the_screen(
    tools: DesktopTools, calculator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shot = await tools.ok("screenshot")
    data = Path(shot["path"]).read_bytes()
    assert data.startswith(PNG_MAGIC) and shot["artifact"].endswith(".png")
    image = Image.open(io.BytesIO(data))
    image.verify()
    image = Image.open(io.BytesIO(data)).convert("L")
    assert image.size == (1280, 800) == (shot["width"], shot["height"]) and shot["screen"] == [1280, 800]
    [window] = [w for w in (await tools.ok("windows"))["windows"] if w["title"] == "Calculator"]
    x, y, w, h = window["bounds"]
    assert ImageStat.Stat(image.crop((x + 10, y + 10, x + w - 10, y + h - 10))).mean[0] > 150  # the light calculator
    assert ImageStat.Stat(image.crop((900, 600, 1280, 800))).mean[0] < 5  # the empty black screen

    part = await tools.ok("screenshot", region=[x, y, 200, 100], scale=0.5, name="shots/part")
    assert part["artifact"] == "shots/part.png" and (part["width"], part["height"]) == (100, 50)
    assert Image.open(part["path"]).size == (100, 50) and part["region"] == [x, y, 200, 100]
    clipped = await tools.ok("screenshot", region=[1200, 700, 500, 500])
    assert clipped["region"] == [1200, 700, 80, 100] and Image.open(clipped["path"]).size == (80, 100)
    assert "lies outside the screen" in await tools.fails("screenshot", region=[2000, 0, 10, 10])
    monkeypatch.setattr("saucer.tools.desktop.core._MAX_PIXELS", 4_000_000)  # as if the screen were 8K
    assert "2560x1600 image is too large (at most 4,000,000 pixels)" in await tools.fails("screenshot", scale=2)
    assert "escapes the sandbox root" in await tools.fails("screenshot", name="../outside")
    assert not (tmp_path / "outside.png").exists()


async def test_ui_tree_of_the_calculator(tools: DesktopTools, calculator: subprocess.Popen[bytes]) -> None:
    await _clear(tools)
    tree = await tools.ok("ui_tree")
    assert (tree["app"], tree["window"], tree["pid"]) == ("gnome-calculator", "Calculator", calculator.pid)
    nodes = list(_nodes(tree["tree"]))
    assert tree["node_count"] == len(nodes) > 50 and not tree["truncated"]
    assert all(ID_PATTERN.match(n["id"]) for n in nodes) and len({n["id"] for n in nodes}) == len(nodes)
    names = {n["name"] for n in nodes}
    assert {"2", "3", "+", "=", "Undo"} <= names
    assert {"window", "button", "label", "text box"} <= {n["role"] for n in nodes}
    [seven] = [n for n in nodes if n["name"] == "7"]
    x, y, w, h = seven["bounds"]
    assert x >= 0 and x + w <= 1280 and y >= 0 and y + h <= 800 and w > 20 and h > 20

    again = await tools.ok("ui_tree", app="gnome-calculator", include_tree=False, save_as="trees/before")
    assert again["tree"] is None and again["window"] is None and again["artifact"] == "trees/before.json"
    saved = json.loads(Path(again["path"]).read_text())
    assert saved["node_count"] == again["node_count"]
    saved_ids = {n["name"]: n["id"] for n in _nodes(saved["tree"]) if n["role"] == "label"}
    assert saved_ids["7"] == seven["id"]  # the same element keeps its id from one tree to the next

    small = await tools.ok("ui_tree", max_nodes=5)
    assert small["node_count"] == 5 == len(list(_nodes(small["tree"]))) and small["truncated"]
    shallow = await tools.ok("ui_tree", max_depth=1)
    assert shallow["depth_limited"] and all("children" not in c for c in shallow["tree"].get("children", []))


async def test_click_by_name_uses_the_buttons_action(tools: DesktopTools, calculator: Any) -> None:
    await _clear(tools)
    for name in ["2", "+", "3", "="]:
        clicked = await tools.ok("click", name=name, app="gnome-calculator")
        assert clicked["method"] == "action" and clicked["action"] == "Click"
        assert clicked["element"]["name"] == name and clicked["via"]["role"] == "button"
    await _display_shows(tools, "5")
    # "=" now also labels the history row; the one inside a button is still the only clickable one.
    assert (await tools.ok("click", name="=", app="gnome-calculator"))["via"]["role"] == "button"


async def test_pointer_clicks_land_where_the_window_is(
    tools: DesktopTools, calculator: Any, desktop_env: dict[str, str]
) -> None:
    """GTK 4 reports positions relative to its window: moving the window must not break pointer clicks."""
    await _clear(tools)
    [window] = [w for w in (await tools.ok("windows"))["windows"] if w["title"] == "Calculator"]
    probe = display.Display(desktop_env["DISPLAY"])
    try:
        probe.create_resource_object("window", int(window["id"], 16)).configure(x=400, y=150)
        probe.sync()
    finally:
        probe.close()
    await asyncio.sleep(0.3)
    [moved] = [w for w in (await tools.ok("windows"))["windows"] if w["title"] == "Calculator"]
    assert moved["bounds"][:2] == [400, 150]
    for name in ["7", "×", "6", "="]:
        clicked = await tools.ok("click", name=name, app="gnome-calculator", method="pointer")
        assert clicked["method"] == "pointer"
        x, y, w, h = moved["bounds"]
        assert x <= clicked["x"] < x + w and y <= clicked["y"] < y + h
    await _display_shows(tools, "42")


async def test_click_by_element_id_and_unknown_ids(tools: DesktopTools, calculator: Any) -> None:
    await _clear(tools)
    tree = await tools.ok("ui_tree", app="gnome-calculator")
    ids = {n["name"]: n["id"] for n in _nodes(tree["tree"]) if n["role"] == "label"}
    for name in ["9", "−", "4", "="]:
        clicked = await tools.ok("click", element_id=ids[name])
        assert clicked["method"] == "action" and clicked["element"]["id"] == ids[name]
    await _display_shows(tools, "5")
    assert "unknown element id 'eaaaaaaaaaa'" in await tools.fails("click", element_id="eaaaaaaaaaa")
    assert "has no click or press action" in await tools.fails("click", element_id=tree["tree"]["id"], method="action")


async def test_keyboard_typing_and_keys(tools: DesktopTools, calculator: Any) -> None:
    await _clear(tools)
    await tools.ok("type_text", text="12+30\n")
    await _display_shows(tools, "42")
    await tools.ok("press_keys", keys="ctrl+a BackSpace")
    typed = await tools.ok("type_text", text="3×3")  # × is on no key of the virtual keyboard
    assert typed["characters"] == 3
    await tools.ok("press_keys", keys="Return")
    await _display_shows(tools, "9")


async def test_find_waits_and_says_what_is_there(tools: DesktopTools, calculator: Any) -> None:
    started = time.monotonic()
    error = await tools.fails("find", text="no such text", timeout=0.6)
    assert (
        time.monotonic() - started >= 0.6 and "no element with text='no such text'" in error and "after 0.6 s" in error
    )
    assert "similar names: 'Undo'" in await tools.fails("find", name="Undoo")
    found = await tools.ok("find", role="button", name="re:^[0-9] [0-9]$")
    assert len(found["matches"]) == 10 and all(m["path"][0] == "window 'Calculator'" for m in found["matches"])


async def test_windows_lists_and_focuses(tools: DesktopTools, calculator: subprocess.Popen[bytes]) -> None:
    listed = await tools.ok("windows")
    [window] = [w for w in listed["windows"] if w["title"] == "Calculator"]
    assert window["pid"] == calculator.pid and window["app"] == "gnome-calculator"
    focused = await tools.ok("windows", focus=window["id"])
    assert focused["focused"]["id"] == window["id"] and focused["focused"]["focused"]
    assert "no window named 'nope'; there are: Calculator" in await tools.fails("windows", focus="nope")


def _events(probe: display.Display, wanted: int, timeout: float = 5.0) -> list[Any]:
    events: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(events) < wanted and time.monotonic() < deadline:
        while probe.pending_events():
            event = probe.next_event()
            if event.type == X.MappingNotify:
                probe.refresh_keyboard_mapping(event)
            elif event.type in (X.ButtonPress, X.KeyPress):
                events.append(event)
        time.sleep(0.02)
    return events


async def test_input_events_arrive_exactly(tools: DesktopTools, calculator: Any, desktop_env: dict[str, str]) -> None:
    """Clicks, wheel and keys as a window of the test's own receives them."""
    probe = display.Display(desktop_env["DISPLAY"])
    window = probe.screen().root.create_window(
        700,
        300,
        200,
        150,
        0,
        probe.screen().root_depth,
        X.InputOutput,
        X.CopyFromParent,
        background_pixel=probe.screen().white_pixel,
        event_mask=X.ButtonPressMask | X.KeyPressMask | X.StructureNotifyMask,
    )
    window.set_wm_name("input probe")
    window.map()
    probe.sync()
    try:
        await asyncio.sleep(0.3)
        await tools.ok("windows", focus="input probe")
        await tools.ok("click", x=750, y=350)
        await tools.ok("click", x=760, y=360, button="right", double=True)
        await tools.ok("scroll", direction="down", amount=3, x=770, y=370)
        await tools.ok("scroll", direction="up", amount=1, x=770, y=370)
        clicks = await asyncio.to_thread(_events, probe, 7)
        assert [(e.detail, e.event_x, e.event_y) for e in clicks] == [
            (1, 50, 50),
            (3, 60, 60),
            (3, 60, 60),
            (5, 70, 70),
            (5, 70, 70),
            (5, 70, 70),
            (4, 70, 70),
        ]
        await tools.ok("press_keys", keys="ctrl+shift+a Return")
        await tools.ok("type_text", text="H@é")  # é is on no key of the virtual keyboard: a spare key gets it
        modifiers = (XK.string_to_keysym("Control_L"), XK.string_to_keysym("Shift_L"))
        presses = await asyncio.to_thread(_events, probe, 9)  # 5 keys and 4 presses of ctrl or shift
        keys = [e for e in presses if probe.keycode_to_keysym(e.detail, 0) not in modifiers]
        level = lambda e: 1 if e.state & X.ShiftMask else 0  # noqa: E731
        typed = [(probe.keycode_to_keysym(e.detail, level(e)), e.state & (X.ShiftMask | X.ControlMask)) for e in keys]
        assert typed == [
            (XK.string_to_keysym("A"), X.ShiftMask | X.ControlMask),
            (XK.string_to_keysym("Return"), 0),
            (XK.string_to_keysym("H"), X.ShiftMask),
            (XK.string_to_keysym("at"), X.ShiftMask),
            (XK.string_to_keysym("eacute"), 0),
        ], typed
    finally:
        window.destroy()
        probe.close()


async def test_launch_reports_what_happened(tools: DesktopTools, calculator: subprocess.Popen[bytes]) -> None:
    second = await tools.ok("launch", command="gnome-calculator", wait=30)
    assert second["ready"] and second["running"] and second["app"] == "gnome-calculator"
    assert second["windows"] == ["Calculator"] and second["pid"] != calculator.pid
    assert "several applications match 'gnome-calculator'" in await tools.fails("ui_tree", app="gnome-calculator")
    assert (await tools.ok("ui_tree", max_depth=0))["pid"] == second["pid"]  # the newest window has the focus
    quick = await tools.ok("launch", command="true")
    assert quick["exit_code"] == 0 and not quick["running"] and "exited at once with status 0" in quick["note"]
    error = await tools.fails("launch", command=["sh", "-c", "echo boom >&2; exit 3"], wait=5)
    assert "sh exited with status 3" in error and "boom" in error
    sleeper = await tools.ok("launch", command="sleep 60", wait=0.3)
    assert sleeper["running"] and not sleeper["ready"] and "no window of the program appeared" in sleeper["note"]
    assert Path(sleeper["log"]).parent == tools.desktop.options.artifacts
    await tools.aclose()
    assert _gone(sleeper["pid"]) and _gone(second["pid"])  # programs started by launch end with the server
    assert calculator.poll() is None


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


async def test_ids_of_a_closed_application_are_reported_gone(
    tools: DesktopTools, calculator: subprocess.Popen[bytes]
) -> None:
    tree = await tools.ok("ui_tree", app="gnome-calculator")
    ids = {n["name"]: n["id"] for n in _nodes(tree["tree"])}
    calculator.terminate()
    calculator.wait(timeout=10)
    error = await tools.fails("click", element_id=ids["7"])
    assert "no longer exists" in error, error
    assert "no application named 'gnome-calculator'" in await tools.fails("ui_tree", app="gnome-calculator")
