"""A Context never wedges: what a commit would refuse is refused when it is written,
and a commit that fails anyway leaves the Context usable and says what happened."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from saucer.context import Context, ContextNames
from saucer.context.events import MAX_DEPTH, ValueNotStorableError
from saucer.store import OutcomeUnknownError, StoreError
from saucer.store.memory import MemoryStore

N = ContextNames


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


WRITES = {
    "set": lambda ctx, v: ctx.set(N.TOOL_INFO, {"x": v}),
    "update_dict": lambda ctx, v: ctx.update_dict(N.TOOL_INFO, {"x": v}),
    "update_dict many": lambda ctx, v: ctx.update_dict({N.APPLICATION_WINDOW_INFO: v}),
    "update_vars": lambda ctx, v: ctx.update_vars(set={"deep": v}),
    "append": lambda ctx, v: ctx.append("log", v),
    "compare_and_set": lambda ctx, v: ctx.compare_and_set("deep", None, v),
    "structural logs": lambda ctx, v: ctx.add_to_structural_logs({"Round": 1, "SubtaskIndex": 0, "Data": v}),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_value_nested_past_the_limit_is_refused_when_written(db_url: str, write: str) -> None:
    ctx = Context.open(db_url, "s")
    ctx.update_vars(set={"kept": 1})
    with pytest.raises(ValueNotStorableError, match=f"nest more than {MAX_DEPTH} levels deep") as refused:
        WRITES[write](ctx, _nested(300))
    assert refused.value.key in ("TOOL_INFO", "APPLICATION_WINDOW_INFO", "vars.deep", "vars.log", "STRUCTURAL_LOGS")
    assert ctx.pending == [{"op": "set", "var": "kept", "value": 1}]  # nothing of the refused write
    assert ctx.commit() == 1
    ctx.close()
    assert Context.open(db_url, "s").vars == {"kept": 1}


def test_values_at_the_limit_are_stored_and_read_back_everywhere(db_url: str) -> None:
    ctx = Context.open(db_url, "s", snapshot_every=1)
    deepest = _nested(MAX_DEPTH - 1)  # the dict around it makes MAX_DEPTH
    for write in WRITES.values():
        write(ctx, deepest)
        ctx.commit()
    ctx.append("log", deepest)
    ctx.add_to_structural_logs({"Round": 1, "SubtaskIndex": 0, "Data": deepest})
    ctx.commit()
    live = ctx.to_dict()
    ctx.close()
    again = Context.open(db_url, "s")
    assert again.to_dict() == live
    assert again.diff(0, again.version)  # the whole state, deepest values included
    assert again.compare_and_set("log", again.get_var("log"), [])  # compares the deep current value
    again.commit()
    again.close()


def test_what_a_commit_would_refuse_is_refused_before_anything_is_sent(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    ctx.update_vars(set={"a": 1})
    with pytest.raises(ValueNotStorableError, match="meta"):
        ctx.commit(meta={"x": {1, 2}})
    with pytest.raises(ValueNotStorableError, match="meta"):
        ctx.commit(meta={"x": _nested(300)})
    with pytest.raises(ValueNotStorableError, match="step"):
        ctx.commit(step=2**70)
    with pytest.raises(TypeError, match="step"):
        ctx.commit(step=1.5)
    with pytest.raises(ValueNotStorableError, match="author"):
        ctx.commit(author="a\x00b")
    with pytest.raises(ValueNotStorableError, match="author"):
        ctx.author = "\ud800"
    with pytest.raises(ValueNotStorableError, match="author"):
        Context.open(db_url, "t", author="x\x00")
    assert ctx.version == 0 and len(ctx.pending) == 1
    assert ctx.commit(step=1, meta={"ok": True}) == 1
    ctx.close()


def test_at_must_be_an_int(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    for _ in range(3):
        ctx.incr("n")
        ctx.commit()
    for bad in (2.5, True, "2", [2]):
        with pytest.raises(TypeError, match="at must be an int"):
            Context.open(db_url, "s", at=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be an int"):
            ctx.state_at(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="at must be an int"):
            ctx.fork("f", at=bad)  # type: ignore[arg-type]
    assert Context.open(db_url, "s", at=2).get_var("n") == 2
    ctx.close()


class _Flaky(MemoryStore):
    """A store whose next append fails: before writing, or after (outcome unknown either way)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: str | None = None

    def write_event(self, event: Any, expected_version: int, fence: int | None) -> None:
        mode, self.fail = self.fail, None
        if mode == "after":
            super().write_event(event, expected_version, fence)
        if mode in ("before", "after"):
            raise OutcomeUnknownError(event.session_id, event.version, "connection reset", event=event)
        if mode == "refused":
            raise StoreError("the store refused it")
        super().write_event(event, expected_version, fence)


@pytest.mark.parametrize("mode", ["before", "after", "refused"])
@pytest.mark.parametrize("commit", ["commit", "acommit"])
def test_a_failed_commit_keeps_the_changes_and_the_next_one_writes_them_once(mode: str, commit: str) -> None:
    store = _Flaky()
    ctx = Context.open(store, "s")
    ctx.incr("n")
    ctx.update_vars(set={"a": 1})

    def do_commit() -> int:
        if commit == "commit":
            return ctx.commit()
        return asyncio.run(ctx.acommit())

    store.fail = mode
    with pytest.raises(StoreError) as failed:
        do_commit()
    message = str(failed.value)
    if mode == "refused":
        assert "keeps its 2 changes pending: commit() again, or rollback() to drop them" in message
    else:
        assert "may or may not be written" in message and "writes them only if they were not" in message
    assert ctx.version == 0 and len(ctx.pending) == 2 and ctx.get_var("n") == 1  # usable, nothing lost
    ctx.incr("n")  # more changes on top
    version = do_commit()
    events = list(store.read("s"))
    if mode == "after":  # the first event was written: adopted, not written again
        assert version == 2 and [len(e.ops) for e in events] == [2, 1]
    else:
        assert version == 1 and [len(e.ops) for e in events] == [3]
    assert Context.open(store, "s").get_var("n") == 2 and ctx.pending == []
    ctx.close()


def test_rollback_after_an_unknown_outcome_reads_what_was_written() -> None:
    store = _Flaky()
    ctx = Context.open(store, "s")
    ctx.incr("n")
    store.fail = "after"
    with pytest.raises(OutcomeUnknownError):
        ctx.commit()
    ctx.rollback()
    assert ctx.version == 1 and ctx.get_var("n") == 1 and ctx.pending == []
    ctx.incr("n")
    assert ctx.commit() == 2
    ctx.close()
