"""Forks never run in their parent's workspace: ``fork`` gives each its own folder (issue 33, item 5)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path


def _tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its content hash and modification time (ns)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_demos_printed_fork_then_resume_leaves_the_demo_workspace_alone(run_cli, tmp_path: Path) -> None:
    out = run_cli("demo", check=True, timeout=120).stdout
    (sid,) = [row["id"] for row in json.loads(run_cli("sessions", "--json", check=True).stdout)]
    demo_ws = tmp_path / ".saucer" / "demo" / sid.removeprefix("demo-")
    before = _tree(demo_ws)
    assert before
    lines = out.splitlines()
    [at] = [i for i, line in enumerate(lines) if re.search(rf" fork {sid} --at \d+$", line.strip())]
    assert "own new workspace" in lines[at - 1], lines[at - 1]  # the comment above it says so
    forked = subprocess.run(
        lines[at].strip(),
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert forked.returncode == 0, forked.stderr
    [where] = [line.split(": ", 1)[1] for line in forked.stdout.splitlines() if "its tools act in" in line]
    fork_ws = Path(where)
    assert fork_ws.is_dir() and fork_ws.parent == demo_ws.resolve().parent and fork_ws != demo_ws.resolve()
    [resume] = [line.split("run it: ", 1)[1] for line in forked.stdout.splitlines() if "run it: " in line]
    subprocess.run(
        resume, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert _tree(demo_ws) == before  # not one file of the original demo written again
    assert _tree(fork_ws)  # the fork's steps acted in its own folder


def test_a_fork_refuses_its_parents_workspace_and_an_old_fork_needs_one(run_cli, tmp_path: Path) -> None:
    run_cli("demo", check=True, timeout=120)
    (sid,) = [row["id"] for row in json.loads(run_cli("sessions", "--json", check=True).stdout)]
    demo_ws = tmp_path / ".saucer" / "demo" / sid.removeprefix("demo-")
    refused = run_cli("fork", sid, "--at", "3", "--workspace", str(demo_ws))
    assert refused.returncode == 2 and "never runs in its parent's workspace" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    # A fork made through the Python API (no workspace of its own) is not resumed in the parent's.
    from saucer.context import Context
    from saucer.store import open_store

    with open_store(f"sqlite:///{tmp_path / '.saucer' / 'saucer.db'}") as store:
        Context.open(store, sid, create=False).fork("bare", at=3).close()
    before = _tree(demo_ws)
    bare = run_cli("resume", "bare")
    assert bare.returncode == 2 and "--workspace DIR" in bare.stderr, bare.stderr
    assert _tree(demo_ws) == before
