"""A follower plan drives GNOME Calculator through the real ``saucer run --plan`` process.

The plan is examples/plans/desktop-calculator.json, run as docs/tutorials/desktop.md says:
it launches the calculator, reads its tree, clicks 2 + 3 = by element names,
and the results the session logged show "5" in the calculator's entry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from saucer.tools.desktop.virtual import VirtualDesktop

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "examples" / "plans" / "desktop-calculator.json"


def _saucer(
    virtual_desktop: VirtualDesktop, cwd: Path, *args: str, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env.update(virtual_desktop.env, SAUCER_DESKTOP__ENABLED="true", COLUMNS="200", NO_COLOR="1", **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=110,
    )


def _run(virtual_desktop: VirtualDesktop, cwd: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    return _saucer(virtual_desktop, cwd, "run", "--plan", str(PLAN), "--workspace", "ws", *args, **env_extra)


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("children", ()):
        yield from _nodes(child)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_follower_plan_adds_2_and_3_on_the_calculator(virtual_desktop: VirtualDesktop, tmp_path: Path) -> None:
    proc = _run(virtual_desktop, tmp_path, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "desktop.launch success" in proc.stdout and "finished" in proc.stdout
    [log_dir] = (tmp_path / "logs").glob("*/*")
    steps = [json.loads(line) for line in (log_dir / "response.log").read_text().splitlines()]
    results = {}
    for step in steps:
        for command, result in zip(step["commands"], step["results"], strict=False):
            assert result["status"] == "success", result
            results.setdefault(command["tool_name"], []).append(result["result"])

    [launched] = results["desktop.launch"]
    assert launched["ready"] and launched["app"] == "gnome-calculator"
    before, after = results["desktop.ui_tree"]
    labels = {n["name"] for n in _nodes(before["tree"]) if n["role"] == "label"}
    assert {"2", "+", "3", "="} <= labels
    clicks = results["desktop.click"]
    assert [c["element"]["name"] for c in clicks] == ["2", "+", "3", "="]
    assert all(c["method"] == "action" and c["via"]["role"] == "button" for c in clicks)
    [entry] = [n for n in _nodes(after["tree"]) if n["role"] == "text box" and n.get("text")]
    assert entry["text"] == "5"  # read from the tree after clicking 2 + 3 =
    assert results["desktop.find"][0]["matches"][0]["text"] == "5"

    artifacts = log_dir / "artifacts"
    assert json.loads((artifacts / "after.json").read_text())["tree"] == after["tree"]
    [shot] = results["desktop.screenshot"]
    assert shot["path"] == str(artifacts / "result.png")
    assert Image.open(shot["path"]).size == (1280, 800) == (shot["width"], shot["height"])
    deadline = time.monotonic() + 10
    while _alive(launched["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(launched["pid"])  # the session's program ended with the session


def test_launch_needs_approval(virtual_desktop: VirtualDesktop, tmp_path: Path) -> None:
    # No terminal to ask: the step would wait as a pending approval (approvals.timeout); 0 refuses it at once.
    proc = _run(virtual_desktop, tmp_path, "--approval-timeout", "0")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "desktop.launch failure" in proc.stdout
    [log_dir] = (tmp_path / "logs").glob("*/*")
    [step] = [json.loads(line) for line in (log_dir / "response.log").read_text().splitlines()]
    assert (
        "refused" in step["results"][0]["error"]
        and "'desktop.launch' is marked sensitive" in step["results"][0]["error"]
    )
    assert not list((log_dir / "artifacts").glob("launch-*.log"))  # nothing was started


def test_the_readme_shows_the_example_plan() -> None:
    page = (ROOT / "docs" / "tutorials" / "desktop.md").read_text()
    [block] = re.findall(r"drives GNOME Calculator offline\n.*?```json\n(.*?)```", page, re.S)
    assert json.loads(block) == json.loads(PLAN.read_text())


def test_save_ui_tree_stores_a_tree_and_a_screenshot_before_each_step(
    virtual_desktop: VirtualDesktop, tmp_path: Path
) -> None:
    """system.save_ui_tree: one tree (or why there is none) and one screenshot per step, in the step's record and
    in saucer show; the plan's own commands are unchanged."""
    proc = _run(virtual_desktop, tmp_path, "--yes", SAUCER_SYSTEM__SAVE_UI_TREE="true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [log_dir] = (tmp_path / "logs").glob("*/*")
    steps = [json.loads(line) for line in (log_dir / "response.log").read_text().splitlines()]
    assert len(steps) == 4
    assert [[c["tool_name"] for c in step["commands"]] for step in steps][0] == ["desktop.launch"]
    trees = []
    for step in steps:
        [tree] = [a for a in step["artifacts"] if a["kind"] == "ui_tree" and not a.get("after")]
        [shot] = [a for a in step["artifacts"] if a["kind"] == "screenshot" and not a.get("after")]
        prefix = f"step-{step['session_step']:04d}"
        assert Path(shot["path"]) == log_dir / "artifacts" / f"{prefix}-screen.png"
        assert Image.open(shot["path"]).size == (1280, 800)
        trees.append(tree)
    # Before the first step the calculator is not running yet: the record says why there is no tree (no
    # application on the bus, or no focused window when an earlier test left a helper like a portal running).
    assert trees[0]["error"].startswith("tool 'desktop.ui_tree' failed") and "path" not in trees[0]
    for step, tree in zip(steps[1:], trees[1:], strict=False):
        assert Path(tree["path"]) == log_dir / "artifacts" / f"step-{step['session_step']:04d}-tree.json"
        saved = json.loads(Path(tree["path"]).read_text())
        assert saved["app"] == tree["app"] == "gnome-calculator" and saved["node_count"] == tree["nodes"] > 20
    labels = {n["name"] for n in _nodes(json.loads(Path(trees[1]["path"]).read_text())["tree"]) if n["role"] == "label"}
    assert {"2", "+", "3", "="} <= labels  # what the clicks of step 3 were chosen from

    # After the last step of each round (a plan step is a round) the desktop is captured once more.
    last_of_round = {step["round"]: step["session_step"] for step in steps}
    for step in steps:
        after_step = [a["kind"] for a in step["artifacts"] if a.get("after")]
        assert after_step == (["ui_tree", "screenshot"] if last_of_round[step["round"]] == step["session_step"] else [])
    after = [a for a in steps[-1]["artifacts"] if a.get("after")]
    prefix = f"step-{steps[-1]['session_step']:04d}-after"
    assert (
        Path(after[0]["path"]).name == f"{prefix}-tree.json" and Path(after[1]["path"]).name == f"{prefix}-screen.png"
    )
    final = {
        n.get("text") for n in _nodes(json.loads(Path(after[0]["path"]).read_text())["tree"]) if n["role"] == "text box"
    }
    assert "5" in final  # the result of the last click, which no capture before a step shows

    show = _saucer(virtual_desktop, tmp_path, "show", "last")
    assert show.returncode == 0, show.stderr
    for tree in trees[1:]:
        assert f"ui tree: {tree['path']} ({tree['nodes']} elements)" in show.stdout
    assert f"ui tree after the step: {after[0]['path']}" in show.stdout
    assert show.stdout.count("screenshot: ") == 4 and "(1280x800)" in show.stdout
    assert show.stdout.count("screenshot after the step: ") == len(last_of_round)
    assert "ui tree: not saved: " in show.stdout
    data = json.loads(_saucer(virtual_desktop, tmp_path, "show", "last", "--json").stdout)
    listed = [e["artifacts"] for e in data["events"] if e["kind"] == "step"]
    assert listed == [step["artifacts"] for step in steps]
