"""A follower session with a desktop fills UFO's APPLICATION_* names from the focused window (saucer state)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from saucer.tools.desktop.virtual import VirtualDesktop

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "examples" / "plans" / "desktop-calculator.json"


def _saucer(virtual_desktop: VirtualDesktop, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env.update(virtual_desktop.env, SAUCER_DESKTOP__ENABLED="true", COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_saucer_state_shows_the_focused_application(virtual_desktop: VirtualDesktop, tmp_path: Path) -> None:
    run = _saucer(virtual_desktop, tmp_path, "run", "--plan", str(PLAN), "--workspace", "ws", "--yes")
    assert run.returncode == 0, run.stdout + run.stderr
    state = _saucer(virtual_desktop, tmp_path, "state", "last", "--json")
    assert state.returncode == 0, state.stderr
    names = json.loads(state.stdout)["names"]
    window = names["APPLICATION_WINDOW_INFO"]
    assert window["title"] == "Calculator" and window["app"] == "gnome-calculator"
    assert isinstance(window["pid"], int) and len(window["bounds"]) == 4 and window["id"].startswith("0x")
    assert names["APPLICATION_PROCESS_NAME"] == "gnome-calculator"  # the program desktop.launch started
    assert names["APPLICATION_ROOT_NAME"] == "gnome-calculator"
    # Filled by the first step (the launch), in that step's own commit.
    first = json.loads(_saucer(virtual_desktop, tmp_path, "state", "last", "--at", "3", "--json").stdout)["names"]
    assert first["APPLICATION_PROCESS_NAME"] == "gnome-calculator"
    text = _saucer(virtual_desktop, tmp_path, "state", "last").stdout
    assert "APPLICATION_PROCESS_NAME" in text and "gnome-calculator" in text
