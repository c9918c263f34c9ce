"""Step records are typed and versioned: both stored forms (a step event's meta and a
``response.log`` line) say their step format, older ones are read through the upcasters
(from real version 1 bytes: the golden stores and a ``response.log`` saucer wrote),
and newer ones are refused naming both versions."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.engine.cursor import retry_cursor
from saucer.engine.experience import experience_plan
from saucer.engine.logs import StepRecord, read_step_log
from saucer.engine.step_format import STEP_FORMAT, STEP_FORMAT_KEY, StepFormatError, step_format_of, upcast_step
from saucer.store import open_store
from saucer.store.memory import MemoryStore
from saucer.store.model import Event

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "2026-11-saucer-0.1.0-sqlite-schema2" / "store.db"
#: Written by saucer at commit 2424ba9 (``tests/golden/make_golden.py``, session golden-failed).
RESPONSE_V1 = Path(__file__).with_name("data") / "response-v1.log"


@pytest.fixture
def golden(tmp_path: Path) -> Any:
    copy = tmp_path / "store.db"
    shutil.copyfile(GOLDEN, copy)
    with open_store(f"sqlite:///{copy}") as store:
        yield store


def _steps(store: Any, prefix: str) -> tuple[str, list[Event]]:
    sid = next(s.session_id for s in store.sessions() if s.session_id.startswith(prefix))
    return sid, [e for e in store.read(sid) if e.meta.get("kind") == "step"]


def test_golden_step_events_are_version_1_and_read_in_the_current_shape(golden: Any) -> None:
    seen = 0
    for prefix in ("golden-finished", "golden-failed", "golden-interrupted"):
        sid, steps = _steps(golden, prefix)
        for event in steps:
            raw = orjson.loads(orjson.dumps(event.meta))
            assert STEP_FORMAT_KEY not in raw and step_format_of(raw) == 1
            current = upcast_step(event.meta)
            assert current == {**raw, STEP_FORMAT_KEY: STEP_FORMAT}  # v1 -> v2 keeps every field
            assert event.meta == raw  # the input is not changed
            record = StepRecord.from_dict(event.meta, sid)
            assert (record.round, record.session_step, record.agent, record.commands) == (
                raw["round"],
                raw["session_step"],
                raw["agent"],
                raw["commands"],
            )
            assert record.to_meta()[STEP_FORMAT_KEY] == STEP_FORMAT
            seen += 1
    assert seen >= 5


def test_golden_sessions_give_their_failed_step_and_their_plan(golden: Any) -> None:
    sid, steps = _steps(golden, "golden-failed")
    point, meta = retry_cursor(golden, sid)
    failed = next(e for e in steps if e.meta["status"] == "FAIL")
    assert point is not None and point.plan_index == failed.meta["plan_index"] and point.phase == "round_start"
    sid, _ = _steps(golden, "golden-finished")
    plan = experience_plan("again", golden, sid, golden.head(sid), None)
    assert [c.tool_name for s in plan.steps for c in s.commands] == ["files.write", "files.list", "shell.run"]


def test_a_version_1_response_log_reads_back() -> None:
    lines = RESPONSE_V1.read_bytes().splitlines()
    assert all(STEP_FORMAT_KEY not in orjson.loads(line) for line in lines)
    records = list(read_step_log(RESPONSE_V1))
    assert [(r.session_step, r.status, r.plan_index) for r in records] == [(1, "FINISH", 0), (2, "FAIL", 1)]
    assert records[1].results[0]["status"] == "failure" and records[0].timings["total_ms"] > 0


def test_a_newer_step_format_is_refused_naming_both_versions(tmp_path: Path) -> None:
    newer = {**StepRecord("s", 0, 1, 1, "a", "CONTINUE").to_meta(), STEP_FORMAT_KEY: STEP_FORMAT + 1, "kind": "step"}
    with pytest.raises(
        StepFormatError, match=rf"step format {STEP_FORMAT + 1}; this saucer reads up to step format {STEP_FORMAT}"
    ):
        StepRecord.from_dict(newer)
    log = tmp_path / "response.log"
    log.write_bytes(RESPONSE_V1.read_bytes() + orjson.dumps({**newer, "session_id": "s"}) + b"\n")
    reader = read_step_log(log)
    assert next(reader).session_step == 1 and next(reader).session_step == 2
    with pytest.raises(StepFormatError, match=rf"response.log:3: .*step format {STEP_FORMAT + 1}"):
        next(reader)
    # Retrying a failed session reads its step records: a newer one is an error, never a guess.
    store = MemoryStore()
    store.create_session("s")
    failed = {**newer, "status": "FAIL", "cursor": {"phase": "step", "round": 0}}
    store.append(
        "s",
        0,
        [],
        author="system",
        round=0,
        meta={"kind": "round_start", "cursor": {"phase": "round_start", "round": 0}},
    )
    store.append("s", 1, [], author="a", round=0, step=1, meta=failed)
    with pytest.raises(StepFormatError, match="session 's': the step at version 2 is in step format"):
        retry_cursor(store, "s")


@pytest.mark.parametrize("bad", [0, -1, True, "2", 1.5, None])
def test_a_step_format_that_is_not_a_version_is_refused(bad: Any) -> None:
    with pytest.raises(StepFormatError, match="is not a positive integer"):
        upcast_step({STEP_FORMAT_KEY: bad, "round": 0})


def test_a_malformed_response_log_line_names_its_place(tmp_path: Path) -> None:
    log = tmp_path / "response.log"
    log.write_bytes(RESPONSE_V1.read_bytes() + b"[1, 2]\n")
    with pytest.raises(ValueError, match=r"response.log:3: not a step record \(not a JSON object\)"):
        list(read_step_log(log))
