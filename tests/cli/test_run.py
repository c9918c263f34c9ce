"""run, resume, demo and store commands, as subprocesses in a fresh directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

PLAN = {
    "task": "notes",
    "steps": [
        {
            "subtask": "start",
            "commands": [{"tool_name": "files.write", "parameters": {"path": "n.md", "content": "a\n"}}],
        },
        {
            "subtask": "more",
            "commands": [{"tool_name": "files.append", "parameters": {"path": "n.md", "content": "b\n"}}],
        },
        {"subtask": "look", "commands": [{"tool_name": "shell.run", "parameters": {"command": "cat n.md"}}]},
    ],
}


def _session_ids(run_cli) -> list[str]:
    return [row["id"] for row in json.loads(run_cli("sessions", "--json", check=True).stdout)]


def test_demo_does_real_work_and_prints_commands_that_work(run_cli, tmp_path: Path) -> None:
    proc = run_cli("demo", check=True, timeout=60)
    out = proc.stdout
    assert "session demo-" in out and "finished" in out
    (sid,) = _session_ids(run_cli)
    workspace = tmp_path / ".saucer" / "demo" / sid.removeprefix("demo-")
    todo = (workspace / "project" / "todo.md").read_text()
    assert "tomato and pepper seeds" in todo and "water the basil" in todo  # written, appended, edited by sed
    suggested = [line.strip() for line in out.splitlines() if f" {sid}" in line and not line.strip().startswith("#")]
    suggested = [line for line in suggested if " saucer " in f" {line} " or line.split()[0].endswith("saucer")]
    assert len(suggested) >= 5, out
    viewer = [line for line in suggested if " ui " in line]
    assert len(viewer) == 1 and "--open" in viewer[0], out
    for line in suggested:  # exactly as printed, through a shell
        if line in viewer:
            _serves_the_session(line, sid, tmp_path)
            continue
        result = subprocess.run(
            line, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        assert result.returncode == 0, (line, result.stdout, result.stderr)


def _serves_the_session(line: str, sid: str, cwd: Path) -> None:
    """The printed ``saucer ui`` command keeps serving: it must show the session's page, then stop on Ctrl-C."""
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as sock:  # a free port, so that a viewer already on 8766 does not answer instead
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["BROWSER"] = "true"  # --open runs the `true` command instead of a browser
    proc = subprocess.Popen(
        f"exec {line} --port {port}",
        shell=True,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/sessions/{sid}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                page = httpx.get(url, timeout=5)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.2)
        assert page.status_code == 200 and sid in page.text
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and url in err, err


def test_run_plan_then_inspect_and_resume(run_cli, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    proc = run_cli("run", "--plan", "plan.json", "--workspace", "ws", check=True)
    assert "files.append success" in proc.stdout and "shell.run success" in proc.stdout
    assert (tmp_path / "ws" / "n.md").read_text() == "a\nb\n"
    (sid,) = _session_ids(run_cli)
    again = run_cli("resume", sid, check=True)
    assert "finished" in again.stdout
    assert (tmp_path / "ws" / "n.md").read_text() == "a\nb\n"  # nothing ran twice
    rows = json.loads(run_cli("sessions", "--json", check=True).stdout)
    assert rows[0]["status"] == "finished" and rows[0]["steps"] == 3


def test_failed_command_makes_a_nonzero_exit(run_cli, tmp_path: Path) -> None:
    plan = {
        "task": "bad",
        "steps": [{"subtask": "x", "commands": [{"tool_name": "files.read", "parameters": {"path": "../etc/passwd"}}]}],
    }
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    proc = run_cli("run", "--plan", "bad.json", "--workspace", "ws")
    assert proc.returncode == 1
    assert "failure" in proc.stdout


def test_run_user_mistakes(run_cli, tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"task": "t", "steps": [{"subtask": "s", "commands": [{"tool": 1}]}]}')
    cases = [
        (("run",), "--request TEXT or --plan"),
        (("run", "--plan", "nope.json"), "no such plan"),
        (("run", "--plan", "broken.json"), "broken.json"),
        (("run", "--request", "hello"), "SAUCER_LLM_MODEL"),
        (("run", "--request", "x", "--plan", "broken.json"), "not both"),
        (("resume", "nobody"), "no saucer store"),
    ]
    for args, message in cases:
        proc = run_cli(*args)
        assert proc.returncode != 0, args
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr


def test_bad_config_is_named(run_cli, tmp_path: Path) -> None:
    (tmp_path / "saucer.toml").write_text("[system]\nmax_stepz = 3\n")
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    proc = run_cli("run", "--plan", "plan.json")
    assert proc.returncode == 2 and "max_stepz" in proc.stderr and "Traceback" not in proc.stderr


def test_folder_of_plans_runs_as_a_pool(run_cli, tmp_path: Path) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    for i in range(3):
        plan = {
            "task": f"p{i}",
            "steps": [
                {
                    "subtask": "w",
                    "commands": [{"tool_name": "files.write", "parameters": {"path": f"f{i}.txt", "content": str(i)}}],
                }
            ],
        }
        (folder / f"p{i}.json").write_text(json.dumps(plan))
    run_cli("run", "--plan", "plans", "--concurrency", "2", "--workspace", "ws", check=True, timeout=90)
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]
    assert len(_session_ids(run_cli)) == 3
    listed = json.loads(run_cli("sessions", "--json", check=True).stdout)
    assert sorted(row["task"] for row in listed) == ["p0", "p1", "p2"]  # each plan's own task, not the folder's name


def test_a_session_id_that_is_a_path_segment_is_refused(run_cli, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    for bad in (".", ".."):
        proc = run_cli("run", "--plan", "plan.json", "--session-id", bad)
        assert proc.returncode != 0 and "is not valid" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_store_commands(cli_here, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    cli_here("run", "--plan", "plan.json", "--workspace", "ws", check=True)
    (sid,) = _session_ids(cli_here)
    assert "schema version" in cli_here("store", "migrate", check=True).stdout
    head = json.loads(cli_here("state", sid, "--json", check=True).stdout)["version"]
    cli_here("store", "prune", sid, "--keep-last", "2", check=True)
    assert json.loads(cli_here("state", sid, "--at", str(head - 2), "--json", check=True).stdout)["version"] == head - 2
    old = cli_here("state", sid, "--at", "1")
    assert old.returncode == 2 and "versions" in old.stderr
    refused = cli_here("store", "delete", sid)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    cli_here("fork", sid, "--at", str(head), "--as", "branch", check=True)
    forked = cli_here("store", "delete", sid, "--yes")
    assert forked.returncode == 2 and "forks that read its log (branch)" in forked.stderr
    cli_here("store", "delete", "branch", "--yes", check=True)
    cli_here("store", "delete", sid, "--yes", check=True)
    assert _session_ids(cli_here) == []
