"""Four applications of different kinds on a bare Xvfb and under a window manager (openbox).

GNOME Calculator (GTK 4), Mousepad (an editor, GTK 3), a Zenity form (a
dialog) and Thunar (a file manager). For each, on one shared Xvfb first bare
(focus PointerRoot, no window manager) and then under openbox: ``launch``
with and without the accessibility bus (``NO_AT_BRIDGE=1``), ``windows``,
``ui_tree`` without ``app=``, the element a task needs within the first 40
lines and 3,000 characters of the operator's tree summary, typed text in the
next summary, and closing like a user (Mousepad: no "restore?" next time).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.desktop import CASES, EDITABLE, FOLDER, OFF_THE_BUS, DesktopTools, need, use_environment
from Xlib import X, Xatom, display

from saucer.agents.treesummary import summarize_tree
from saucer.tools.desktop.virtual import VirtualDesktop

pytestmark = pytest.mark.anyio

#: The window managers the applications run under ("bare": none) -> the Debian package of each.
WINDOW_MANAGERS = {"bare": None, "openbox": "openbox"}
SCREEN = [1280, 800]


@pytest.fixture(scope="module")
def virtual_desktop() -> Iterator[VirtualDesktop]:
    """One Xvfb and bus for the module, with private XDG folders (Mousepad's session state stays here)."""
    need(*(c.package for c in CASES.values()))
    FOLDER.mkdir(exist_ok=True)
    (FOLDER / "notes.txt").write_text("notes\n")
    with VirtualDesktop(private_home=True) as desktop:
        yield desktop


def _wm_running(name: str) -> bool:
    d = display.Display(name)
    try:
        root = d.screen().root
        return root.get_full_property(d.intern_atom("_NET_SUPPORTING_WM_CHECK"), X.AnyPropertyType) is not None
    finally:
        d.close()


@pytest.fixture(scope="module", params=list(WINDOW_MANAGERS))
def window_manager(
    request: pytest.FixtureRequest, virtual_desktop: VirtualDesktop, desktop_env: dict[str, str]
) -> Iterator[str]:
    """No window manager, then openbox on the same display."""
    if WINDOW_MANAGERS[request.param] is None:
        yield request.param
        return
    need(request.param)
    proc = subprocess.Popen(
        [request.param, "--sm-disable"],
        env={**os.environ, **desktop_env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not _wm_running(virtual_desktop.display):
            assert proc.poll() is None and time.monotonic() < deadline, "openbox did not start"
            time.sleep(0.05)
        yield request.param
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


async def _summary_until(tools: DesktopTools, wanted: re.Pattern[str], seconds: float = 10) -> str:
    """The summary of the focused window's tree once it matches ``wanted`` (the application may redraw late)."""
    deadline = time.monotonic() + seconds
    while True:
        tree = await tools.ok("ui_tree")
        summary = summarize_tree(tree["tree"], screen=SCREEN)
        if wanted.search(summary) or time.monotonic() > deadline:
            return summary
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("name", list(CASES))
async def test_an_application_on_any_x_server(window_manager: str, name: str, tools: DesktopTools) -> None:
    case = CASES[name]
    started = await tools.ok("launch", command=list(case.command), wait=40)
    assert started["ready"] and started["running"] and started["app"] == case.app, started
    listed = (await tools.ok("windows"))["windows"]
    mine = [w for w in listed if w["pid"] == started["pid"]]
    assert mine and mine[-1]["focused"], listed  # found on any X server; the new window has the keyboard
    chosen = await tools.ok("windows", focus=mine[-1]["id"])
    assert chosen["focused"]["id"] == mine[-1]["id"] and chosen["focused"]["focused"]
    tree = await tools.ok("ui_tree")  # no app=: the focused window's
    assert tree["app"] == case.app and tree["pid"] == started["pid"]

    # The element the task needs (the text to type into) within 40 lines and 3,000 characters.
    summary = summarize_tree(tree["tree"], screen=SCREEN)
    match = EDITABLE.search(summary)
    assert match, summary
    before = summary[: match.end()]
    assert before.count("\n") < 40 and len(before) < 3000, summary
    element = match.group(1)
    typed = await tools.ok("type_text", text=case.typed, element_id=element)
    assert typed["locator"]["app"] == case.app and typed["locator"]["role"] in ("text", "text box", "entry")
    # What was typed is in the next observation, on the line of that element.
    after = await _summary_until(tools, re.compile(rf"^{element} .*text='[^\n]*{re.escape(case.typed)}", re.M))
    line = next(line for line in after.splitlines() if line.startswith(element))
    assert case.typed in line, after

    # Closed like a user closes it: WM_DELETE_WINDOW (and "Don't Save" for the edited text).
    pid = started["pid"]
    await asyncio.to_thread(tools.desktop.stop_programs)
    assert not _alive(pid)

    # Without the accessibility bus: found by X11 alone, at once, not after the whole wait.
    clock = time.monotonic()
    bare = await tools.ok("launch", command=list(case.command), wait=40, env=OFF_THE_BUS)
    assert bare["ready"] and bare["app"] is None and time.monotonic() - clock < 15, bare
    assert "not on the accessibility bus" in bare["note"]
    if name == "mousepad":
        # The edited document was not left as a crash: no "restore the previous session?" dialog first.
        assert bare["windows"] == ["Untitled 1 - Mousepad"], bare
    listed = (await tools.ok("windows"))["windows"]
    assert any(w["pid"] == bare["pid"] and w["focused"] for w in listed), listed
    error = await tools.fails("ui_tree")
    assert "is not on the accessibility bus" in error and f"pid {bare['pid']}" in error
    await asyncio.to_thread(tools.desktop.stop_programs)
    assert not _alive(bare["pid"])


async def test_a_program_without_net_wm_pid_is_found_by_its_class(
    window_manager: str, tools: DesktopTools, tmp_path: Path
) -> None:
    """A window that sets no _NET_WM_PID (xmessage, old toolkits): matched by WM_CLASS as it appears."""
    script = tmp_path / "plainwindow"
    # Launched programs are confined: they write only below the workspace, the artifacts and their TMPDIR.
    closed = tools.desktop.options.artifacts / "closed"
    closed.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        "#!" + sys.executable + "\n"
        "from Xlib import X, display\n"
        "d = display.Display(); s = d.screen()\n"
        "w = s.root.create_window(10, 10, 200, 100, 0, s.root_depth, X.InputOutput, X.CopyFromParent,\n"
        "                         background_pixel=s.white_pixel)\n"
        "w.set_wm_name('Plain'); w.set_wm_class('plainwindow', 'Plainwindow')\n"
        "w.set_wm_protocols([d.intern_atom('WM_DELETE_WINDOW')])\n"
        "w.map(); d.sync()\n"
        "while True:\n"
        "    e = d.next_event()\n"
        "    if e.type == X.ClientMessage: break\n"
        f"open({str(closed)!r}, 'w').write('asked to close')\n"
    )
    script.chmod(0o755)
    started = await tools.ok("launch", command=[str(script)], wait=20, env={"NO_AT_BRIDGE": "1"})
    assert started["ready"] and started["windows"] == ["Plain"], started
    plain = [w for w in (await tools.ok("windows"))["windows"] if w["title"] == "Plain"]
    assert plain and plain[0]["pid"] is None and plain[0]["app"] == "Plainwindow"
    await asyncio.to_thread(tools.desktop.stop_programs)
    assert not _alive(started["pid"])
    assert closed.read_text() == "asked to close"  # by WM_DELETE_WINDOW, before any signal


async def test_a_window_the_bus_shows_before_x11_maps_it_still_gets_the_keyboard(
    window_manager: str, tools: DesktopTools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GTK says a window is showing on the accessibility bus a moment before X11 maps it (seen on a loaded
    machine): launch waits for the X11 window, gives it the keyboard and remembers it for closing."""
    script = tmp_path / "latewindow"
    script.write_text(
        "#!" + sys.executable + "\n"
        "from Xlib import X, display\n"
        "d = display.Display(); s = d.screen()\n"
        "w = s.root.create_window(10, 10, 200, 100, 0, s.root_depth, X.InputOutput, X.CopyFromParent,\n"
        "                         background_pixel=s.white_pixel)\n"
        "w.set_wm_name('Late'); w.set_wm_class('latewindow', 'Latewindow')\n"
        "w.set_wm_protocols([d.intern_atom('WM_DELETE_WINDOW')])\n"
        "w.change_property(d.intern_atom('_NET_WM_PID'), d.intern_atom('CARDINAL'), 32, [__import__('os').getpid()])\n"
        "import time; time.sleep(0.5); w.map(); d.sync()\n"
        "while d.next_event().type != X.ClientMessage: pass\n"
    )
    script.chmod(0o755)
    desktop = tools.desktop
    real = desktop._look_for_windows

    async def bus_first(result: object, before: set[int], names: set[str]) -> tuple[str | None, list[object]]:
        found, mine = await real(result, before, names)
        if not mine:  # what the bus said while X11 had not mapped the window yet
            result.app, result.windows, result.ready = "latewindow", ["Late"], True  # type: ignore[attr-defined]
            return "atspi", []
        return found, mine

    monkeypatch.setattr(desktop, "_look_for_windows", bus_first)
    started = await tools.ok("launch", command=[str(script)], wait=20, env={"NO_AT_BRIDGE": "1"})
    assert started["ready"] and started["windows"] == ["Late"], started
    late = [w for w in (await tools.ok("windows"))["windows"] if w["pid"] == started["pid"]]
    assert late and late[-1]["focused"], late
    assert int(late[-1]["id"], 16) in desktop.launcher.windows
    await asyncio.to_thread(desktop.stop_programs)
    assert not _alive(started["pid"])


async def test_a_stale_at_spi_bus_property_is_skipped(virtual_desktop: VirtualDesktop, tmp_path: Path) -> None:
    """AT_SPI_BUS left on the root window by a killed session: the session bus's accessibility bus is used,
    and launched programs are pointed at it too."""
    d = display.Display(virtual_desktop.display)
    root, atom = d.screen().root, d.intern_atom("AT_SPI_BUS")
    saved = root.get_full_property(atom, X.AnyPropertyType)
    root.change_property(atom, Xatom.STRING, 8, f"unix:path={tmp_path}/gone/bus_0".encode())
    d.sync()
    tools = DesktopTools(tmp_path / "artifacts")
    try:
        started = await tools.ok("launch", command=list(CASES["zenity"].command), wait=40)
        assert started["app"] == "zenity", started
        assert tools.desktop.stale_bus_property == f"unix:path={tmp_path}/gone/bus_0"
        tree = await tools.ok("ui_tree", app="zenity")
        assert tree["node_count"] > 5
    finally:
        await tools.aclose()
        if saved is not None:
            root.change_property(atom, saved.property_type, saved.format, saved.value)
        else:
            root.delete_property(atom)
        d.close()


@pytest.fixture(autouse=True)
def _in_environment(desktop_env: dict[str, str]) -> Iterator[None]:
    with use_environment(desktop_env):
        yield
