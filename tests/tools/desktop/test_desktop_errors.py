"""The desktop server without a desktop: clear errors naming the Debian packages, limits, bad input, sensitivity.

Nothing here needs Xvfb; the one test that needs a bare D-Bus daemon skips
without it (it is in the dbus package the other desktop tests need too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.desktop import DESKTOP_VARIABLES, DesktopTools

from saucer.dispatch import Command, DesktopServer, LocalCommandDispatcher, default_servers
from saucer.dispatch.servers import configured_servers
from saucer.tools.desktop import PASSED_ENVIRONMENT

pytestmark = pytest.mark.anyio


@pytest.fixture
def no_desktop(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DESKTOP_VARIABLES:
        monkeypatch.delenv(name, raising=False)


async def test_no_display_names_the_packages(tools: DesktopTools, no_desktop: None) -> None:
    for tool, parameters in [
        ("screenshot", {}),
        ("click", {"x": 10, "y": 10}),
        ("press_keys", {"keys": "ctrl+a"}),
        ("type_text", {"text": "hello"}),
        ("scroll", {"x": 1, "y": 1}),
        ("windows", {}),
        ("launch", {"command": "true"}),
    ]:
        error = await tools.fails(tool, **parameters)
        assert "DISPLAY is not set" in error and "apt-get install -y xvfb at-spi2-core dbus" in error, (tool, error)


async def test_no_bus_names_the_packages(tools: DesktopTools, no_desktop: None) -> None:
    for tool, parameters in [("ui_tree", {}), ("find", {"name": "OK"}), ("click", {"name": "OK"})]:
        error = await tools.fails(tool, **parameters)
        assert "no accessibility bus" in error and "DBUS_SESSION_BUS_ADDRESS is not set" in error, (tool, error)
        assert "at-spi2-core" in error and "dbus-run-session" in error


async def test_unreachable_display_and_bus(
    tools: DesktopTools, no_desktop: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DISPLAY", ":4711")
    error = await tools.fails("screenshot")
    assert "cannot open the X display ':4711'" in error and "xvfb" in error
    monkeypatch.delenv("DISPLAY")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/no-such-socket")
    error = await tools.fails("ui_tree")
    assert "no accessibility bus: cannot connect to the D-Bus bus" in error and "at-spi2-core" in error
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "tcp:host=127.0.0.1,port=1")
    error = await tools.fails("ui_tree")
    assert "no accessibility bus" in error


async def test_session_bus_without_at_spi(
    tools: DesktopTools, no_desktop: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A D-Bus session bus that cannot start org.a11y.Bus (at-spi2-core missing) is named as such."""
    if shutil.which("dbus-daemon") is None:
        pytest.skip("needs dbus-daemon: apt-get install -y dbus")
    config = tmp_path / "bus.conf"
    config.write_text(
        "<!DOCTYPE busconfig PUBLIC '-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN' "
        "'http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd'>\n"
        f"<busconfig><type>session</type><listen>unix:path={tmp_path}/bus</listen>"
        "<policy context='default'><allow send_destination='*' eavesdrop='true'/><allow eavesdrop='true'/>"
        "<allow own='*'/></policy></busconfig>\n"
    )
    daemon = subprocess.Popen(
        ["dbus-daemon", f"--config-file={config}", "--nofork", "--print-address=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", daemon.stdout.readline().strip())
        error = await tools.fails("ui_tree")
        assert "no accessibility bus launcher (org.a11y.Bus" in error and "at-spi2-core" in error, error
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


async def test_limits_are_checked_before_anything_else(tools: DesktopTools, no_desktop: None) -> None:
    cases = [
        ("ui_tree", {"max_nodes": 10**9}, "max_nodes must be between 1 and 5000 (the server's --max-nodes), got 1e+09"),
        ("ui_tree", {"max_nodes": 0}, "max_nodes must be between 1 and 5000"),
        ("ui_tree", {"max_depth": -1}, "max_depth must be between 0 and 100"),
        ("ui_tree", {"max_text": 10**7}, "max_text must be between 0 and 10000"),
        ("find", {"text": "5", "timeout": 3600}, "timeout must be between 0 and 120"),
        ("find", {"max_nodes": 10**6, "name": "x"}, "max_nodes must be between 1 and 5000"),
        ("find", {}, "give at least one of name, role or text"),
        ("find", {"name": "re:("}, "is not a valid regular expression"),
        ("launch", {"command": "true", "wait": 10**6}, "wait must be between 0 and 120"),
        ("type_text", {"text": "x" * 10_001}, "at most 10000 per call"),
        ("press_keys", {"keys": "a " * 5001}, "at most 10000 per call"),
        ("screenshot", {"scale": 0}, "minimum of 0 (at 'scale')"),
        ("scroll", {"amount": 10**6}, "maximum of 100 (at 'amount')"),
    ]
    for tool, parameters, expected in cases:
        error = await tools.fails(tool, **parameters)
        assert expected in error, (tool, parameters, error)


async def test_bad_element_ids_and_click_targets(tools: DesktopTools, no_desktop: None) -> None:
    assert "is not an element id" in await tools.fails("click", element_id="../../etc")
    assert "unknown element id 'eaaaaaaaaaa'" in await tools.fails("click", element_id="eaaaaaaaaaa")
    assert "unknown element id" in await tools.fails("type_text", text="x", element_id="eaaaaaaaaaa")
    assert "unknown element id" in await tools.fails("scroll", element_id="eaaaaaaaaaa")
    assert "exactly one of" in await tools.fails("click")
    assert "(got element_id and x and y)" in await tools.fails("click", element_id="eaaaaaaaaaa", x=1, y=2)
    assert "give both x and y" in await tools.fails("click", x=1)
    assert "give both x and y" in await tools.fails("scroll", y=1)


async def test_bad_keys_and_commands(tools: DesktopTools, no_desktop: None) -> None:
    assert "unknown key 'nosuchkey' in 'ctrl+nosuchkey'" in await tools.fails("press_keys", keys="ctrl+nosuchkey")
    assert "keys is empty" in await tools.fails("press_keys", keys="   ")
    assert "empty key name" in await tools.fails("press_keys", keys="ctrl+")
    assert "command is empty" in await tools.fails("launch", command="")
    assert "command is empty" in await tools.fails("launch", command=[])
    assert "cannot parse the command" in await tools.fails("launch", command="gnome-calculator 'unclosed")
    assert "program 'no-such-program-4711' not found" in await tools.fails(
        "launch", command="no-such-program-4711", env={"DISPLAY": ":4711"}
    )


def test_the_server_runs_as_a_module_with_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "saucer.tools.desktop", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--artifacts" in proc.stdout and "at-spi2-core" in proc.stdout


def test_without_the_python_packages_the_server_says_what_to_install() -> None:
    code = (
        "import runpy, sys; sys.modules['dbus_fast'] = None; sys.argv = ['desktop']; "
        "runpy.run_module('saucer.tools.desktop', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "pip install 'saucer[desktop]' (dbus-fast, python-xlib, pillow)" in proc.stderr


def test_configuration_adds_the_server_with_launch_sensitive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPLAY", ":42")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/0/bus")
    monkeypatch.setenv("SECRET_TOKEN", "not for the server")
    assert "desktop" not in default_servers(tmp_path)
    servers = default_servers(tmp_path, desktop=DesktopServer(artifacts=tmp_path / "art"))
    desktop = servers["desktop"]
    assert desktop.sensitive_tools == ["launch"] and servers["shell"].sensitive_commands  # both ask by default
    assert desktop.args[:3] == ["-P", "-m", "saucer.tools.desktop"] and desktop.args[-1] == str(
        (tmp_path / "art").resolve()
    )
    # An MCP stdio server inherits almost nothing: the display and the bus are passed, nothing else.
    assert desktop.env == {k: os.environ[k] for k in PASSED_ENVIRONMENT if os.environ.get(k)}
    assert desktop.env["DISPLAY"] == ":42" and desktop.env["DBUS_SESSION_BUS_ADDRESS"] == "unix:path=/run/user/0/bus"
    assert "SECRET_TOKEN" not in desktop.env
    other = DesktopServer(artifacts=Path("rel"), display=":7", sensitive_tools=())
    assert other.config(tmp_path).env["DISPLAY"] == ":7" and other.config(tmp_path).sensitive_tools == []
    custom = {"time": default_servers(tmp_path)["files"]}
    assert set(configured_servers(custom, tmp_path, desktop=other)) == {"time", "desktop"}
    assert set(configured_servers(custom, tmp_path)) == {"time"}
    assert set(configured_servers({}, tmp_path, desktop=other)) == {"shell", "files", "desktop"}


async def test_launch_is_refused_without_approval(tmp_path: Path, no_desktop: None) -> None:
    """Through the real stdio server: launch needs approval by default; the refusal starts nothing."""
    servers = default_servers(tmp_path, desktop=DesktopServer(artifacts=tmp_path / "art"))
    async with LocalCommandDispatcher.from_config({"desktop": servers["desktop"]}) as dispatcher:
        tools = await dispatcher.list_tools()
        assert {name.split(".", 1)[1] for name in tools} == {
            "screenshot",
            "ui_tree",
            "find",
            "click",
            "type_text",
            "press_keys",
            "scroll",
            "launch",
            "windows",
        }
        marker = tmp_path / "started"
        [refused, screenshot] = await dispatcher.execute_commands(
            [
                Command(tool_name="desktop.launch", parameters={"command": ["touch", str(marker)]}),
                Command(tool_name="desktop.screenshot"),
            ]
        )
    assert refused.status.value == "failure" and "refused: tool 'desktop.launch' needs approval" in refused.error
    assert screenshot.status.value == "skipped"
    assert not marker.exists() and not (tmp_path / "art").exists()
