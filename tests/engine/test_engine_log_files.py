"""Session log files byte for byte: the golden bytes below were written by the log writer before its
files became raw descriptors (os.open/os.write, no io objects); a session's folder naming; lines on disk
when the process is killed without closing anything."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from saucer.engine.logs import (
    EVALUATION_LOG,
    REQUEST_LOG,
    TEXT_LOG,
    EvaluationLogEntry,
    RequestLogEntry,
    SessionLogs,
    StepRecord,
    read_step_log,
    render_markdown,
)


def _scenario(root: Path) -> Path:
    """Every writer of SessionLogs (secrets, non-ASCII, bytes, multi-line), then a resumed run appending."""
    logs = SessionLogs.create(root, "gold task/ü", "gold-1")
    secret = "sk-" + "a1b2c3d4e5" * 4
    rec = StepRecord(
        session_id="gold-1",
        round=0,
        step=1,
        session_step=1,
        agent="follower",
        state="CONTINUE",
        status="FINISH",
        subtask="écrire ✓",
        plan_index=0,
        commands=[{"tool_name": "files.write", "parameters": {"key": secret, "n": 1.5}}],
        results=[{"status": "success", "result": None}],
        cost=0.25,
        started_at=1700000000.125,
        timings={"handle_ms": 1.0},
        version=3,
    )
    logs.write_step(rec)
    logs.write_step(
        {"session_id": "gold-1", "round": 1, "step": 1, "session_step": 2, "agent": "x", "state": "S", "note": secret}
    )
    logs.write_request(
        RequestLogEntry(
            round=0,
            step=1,
            agent="a",
            model="m",
            prompt=[{"role": "user", "content": "hi " + secret}],
            response="ok",
            timestamp=2.0,
        )
    )
    logs.write_request({"round": 1, "model": "m2", "extra_field": [1, 2]})
    logs.write_evaluation(EvaluationLogEntry(scope="round", round=0, complete="yes", reason="done", timestamp=3.0))
    logs.logger(TEXT_LOG).warning("talked %s", "once")
    logs.logger(TEXT_LOG).info("multi\nline ü " + secret)
    logs.logger(REQUEST_LOG).info('{"model": "raw"}')
    logs.logger(EVALUATION_LOG).info('{"scope": "session", "complete": "no"}')
    logs.write_line(TEXT_LOG, b"bytes \xff line")
    logs.write_markdown(render_markdown("gold", logs.step_records(), {"status": "finished"}))
    logs.write_markdown(render_markdown("gold again", logs.step_records(), {"status": "finished"}))
    logs.close()
    again = SessionLogs.reopen(logs.path or root)  # a resumed run appends to its own files
    again.write_step({"session_id": "gold-1", "round": 2, "step": 1})
    again.logger(TEXT_LOG).error("resumed")
    again.close()
    assert logs.path is not None
    return logs.path


GOLDEN: dict[str, bytes] = {
    "evaluation.log": b'{"scope":"round","round":0,"evaluator":"","complete":"yes","reason":"done","sub_scores":{},"cost":0.0,"timestamp":3.0}\n{"scope": "session", "complete": "no"}\n',
    "output.md": b'# gold again\n\n\n## Round 0\n\n- **step 1** `follower` [CONTINUE \xe2\x86\x92 FINISH] \xc3\xa9crire \xe2\x9c\x93 (cost 0.2500)\n  - `files.write` {"key":"sk-***","n":1.5}: **success**\n\n## Round 1\n\n- **step 1** `x` [S \xe2\x86\x92 ]\n\n## Summary\n\n- status: finished\n',
    "request.log": b'{"round":0,"step":1,"agent":"a","model":"m","prompt":[{"role":"user","content":"hi sk-***"}],"response":"ok","prompt_tokens":null,"completion_tokens":null,"cost":null,"latency_ms":null,"error":null,"timestamp":2.0}\n{"round":1,"step":null,"agent":"","model":"m2","prompt":null,"response":null,"prompt_tokens":null,"completion_tokens":null,"cost":null,"latency_ms":null,"error":null,"timestamp":0.0,"extra_field":[1,2]}\n{"model": "raw"}\n',
    "response.log": b'{"session_id":"gold-1","round":0,"step":1,"session_step":1,"agent":"follower","state":"CONTINUE","status":"FINISH","next_agent":null,"next_state":null,"subtask":"\xc3\xa9crire \xe2\x9c\x93","subtask_index":0,"plan_index":0,"commands":[{"tool_name":"files.write","parameters":{"key":"sk-***","n":1.5}}],"results":[{"status":"success","result":null}],"cost":0.25,"error":null,"started_at":1700000000.125,"timings":{"handle_ms":1.0},"version":3,"extra":{},"artifacts":[],"step_format":2}\n{"session_id":"gold-1","round":1,"step":1,"session_step":2,"agent":"x","state":"S","note":"sk-***"}\n{"session_id":"gold-1","round":2,"step":1}\n',
    "session.log": b"WARNING talked once\nINFO multi\nline \xc3\xbc sk-***\nbytes \xef\xbf\xbd line\nERROR resumed\n",
}


def test_the_files_of_a_session_are_byte_for_byte_the_golden_ones(tmp_path: Path) -> None:
    path = _scenario(tmp_path / "logs")
    assert path == (tmp_path / "logs" / "gold_task" / "gold-1").resolve()
    assert {f.name: f.read_bytes() for f in sorted(path.iterdir())} == GOLDEN


def test_a_taken_name_gets_a_suffix_and_missing_parents_are_made(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "logs"  # neither exists yet
    first = SessionLogs.create(root, "t", "s")
    (root / "t" / "s-2").write_text("a file, not a folder: the name is taken all the same")
    second = SessionLogs.create(root, "t", "s")
    assert first.path == (root / "t" / "s").resolve() and second.path == (root / "t" / "s-3").resolve()
    assert second.path.is_dir() and not any(second.path.iterdir())  # no file before the first line
    first.close()
    second.close()


def test_the_folder_is_named_through_a_symlinked_root_as_resolve_names_it(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    logs = SessionLogs.create(tmp_path / "link", "t", "s")
    assert logs.path == (tmp_path / "link" / "t" / "s").resolve() == (tmp_path / "real" / "t" / "s").resolve()
    logs.close()


def test_every_line_written_is_on_disk_when_the_process_is_killed_without_closing(tmp_path: Path) -> None:
    child = textwrap.dedent(
        f"""
        import os
        from saucer.engine.logs import SessionLogs, StepRecord, TEXT_LOG
        logs = SessionLogs.create({str(tmp_path)!r}, "t", "killed")
        for i in range(5):
            logs.write_step(StepRecord(session_id="killed", round=i, step=1, session_step=i + 1, agent="a", state="S"))
            logs.logger(TEXT_LOG).info("step %d", i)
        os.kill(os.getpid(), 9)  # no close, no flush, no atexit
        """
    )
    done = subprocess.run([sys.executable, "-c", child], check=False, env=dict(os.environ))
    assert done.returncode == -9
    folder = tmp_path / "t" / "killed"
    assert [r.round for r in read_step_log(folder)] == [0, 1, 2, 3, 4]
    assert (folder / "session.log").read_text() == "".join(f"INFO step {i}\n" for i in range(5))


def test_a_short_write_is_finished_not_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write may take part of a line (a signal, a nearly full disk): the rest follows, in order."""
    real_write = os.write
    calls = []

    def short_write(fd: int, data: Any) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data)[:3])

    logs = SessionLogs.create(tmp_path, "t", "short")
    monkeypatch.setattr(os, "write", short_write)
    logs.logger(TEXT_LOG).info("a line longer than three bytes")
    logs.write_markdown("# title ü\n")
    monkeypatch.undo()
    logs.close()
    assert logs.path is not None and len(calls) > 2
    assert (logs.path / "session.log").read_bytes() == b"INFO a line longer than three bytes\n"
    assert (logs.path / "output.md").read_text(encoding="utf-8") == "# title ü\n"
