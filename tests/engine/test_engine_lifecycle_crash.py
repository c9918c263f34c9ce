"""Merged lifecycle commits (a round's end and evaluation written with the next round's start or
the session's end): a process killed with SIGKILL between those transactions resumes to the same
result as a run that was never killed, and no committed step runs twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import command_plan

from saucer.context import Context, ContextNames
from saucer.store import open_store

CHILD = Path(__file__).with_name("lifecycle_child.py")
STEPS = 3


def _child(action: str, db_url: str, sid: str, tmp: Path, hold: int) -> list[str]:
    args = [str(tmp / "plan.json"), str(tmp / f"{sid}.lines"), str(tmp / "logs"), str(hold), str(tmp / f"{sid}.marker")]
    return [sys.executable, str(CHILD), action, db_url, sid, *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(CHILD.parent), str(CHILD.parents[2]), env.get("PYTHONPATH", "")])
    return env


def _finish(cmd: list[str], tmp: Path) -> dict[str, Any]:
    out = subprocess.run(cmd, cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _outcome(db_url: str, sid: str, result: dict[str, Any]) -> dict[str, Any]:
    """What must be the same whether the run was killed or not."""
    with open_store(db_url) as store:
        ctx = Context.open(store, sid, create=False, at=store.head(sid))
        kinds = [e.meta.get("kind") for e in store.read(sid)]
        steps = [e.meta["plan_index"] for e in store.read(sid) if e.meta.get("kind") == "step"]
        ends = [
            {k: e.meta[k] for k in ("round_status", "reason", "error", "steps", "cost")}
            for e in store.read(sid)
            if e.meta.get("kind") == "round_end"
        ]
    return {
        "result": {k: result[k] for k in ("status", "steps", "rounds", "cost", "reason")},
        "state": {
            name: ctx.get(name)
            for name in (
                ContextNames.SESSION_STEP,
                ContextNames.ROUND_STEP,
                ContextNames.ROUND_RESULT,
                ContextNames.PREVIOUS_SUBTASKS,
                ContextNames.CURRENT_ROUND_ID,
            )
        },
        "steps": steps,
        "round_ends": ends,
        "ends": (kinds.count("round_end"), kinds.count("evaluation"), kinds[-1]),
    }


@pytest.mark.parametrize("hold", [0, STEPS - 1])
def test_a_kill_between_the_step_and_the_merged_round_end_resumes_to_the_same_result(tmp_path: Path, hold: int) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(command_plan(STEPS, task="lifecycle")))
    db_url = f"sqlite:///{tmp_path / 'saucer.db'}"
    clean = _outcome(db_url, "clean", _finish(_child("run", db_url, "clean", tmp_path, -1), tmp_path))
    assert clean["result"]["status"] == "finished" and clean["ends"] == (STEPS, STEPS + 1, "session_end")

    sid = "killed"
    child = subprocess.Popen(
        _child("run", db_url, sid, tmp_path, hold),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    marker = tmp_path / f"{sid}.marker"
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child never reached the round's end"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with open_store(db_url) as store:
        kinds = [e.meta.get("kind") for e in store.read(sid)]
    # Killed after the step's commit: the round's end and evaluation were deferred, not written.
    assert kinds[-1] == "step" and kinds.count("step") == hold + 1
    assert kinds.count("round_end") == hold  # the earlier rounds' ends went with the next round's start

    resumed = _finish(_child("resume", db_url, sid, tmp_path, -1), tmp_path)
    assert _outcome(db_url, sid, resumed) == clean
    lines = [int(x) for x in (tmp_path / f"{sid}.lines").read_text().split()]
    assert lines == list(range(STEPS)), "a committed step ran again"
