"""fit_to_window: what is kept, what goes first, and what is cut, with the estimate it is told."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saucer.agents.llm.window import estimate_tokens, fit_to_window, prompt_budget
from saucer.config import ConfigError, load_settings


def turn(i: int, result: str = "ok") -> list[dict[str, Any]]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": f"tool{i % 3}", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": result},
    ]


def conversation(turns: int, result: str = "r" * 400) -> list[dict[str, Any]]:
    out = [{"role": "system", "content": "S" * 200}, {"role": "user", "content": "Request: do it"}]
    for i in range(turns):
        out += turn(i, result)
    return out


def test_a_conversation_that_fits_is_sent_as_it_is() -> None:
    msgs = conversation(2)
    fitted = fit_to_window(msgs, budget=10_000, chars_per_token=3)
    assert fitted.messages == msgs and not fitted.trimmed and fitted.fits


def test_the_oldest_turns_go_first_with_their_results_and_a_note() -> None:
    msgs = conversation(10)
    budget = estimate_tokens(msgs, None, 3) // 2
    fitted = fit_to_window(msgs, budget=budget, chars_per_token=3)
    sent = fitted.messages
    assert fitted.fits and fitted.dropped > 0 and fitted.dropped % 2 == 0  # a call and its result go together
    assert sent[0] == msgs[0] and sent[-2:] == msgs[-2:]  # the system prompt and the latest tool results
    assert (
        sent[1]["content"].startswith("Request: do it\n\n[")
        and f"[{fitted.dropped} earlier message(s)" in sent[1]["content"]
    )
    assert "tool0 x" in sent[1]["content"]
    assert sent[2:] == msgs[2 + fitted.dropped :]  # what is kept is the most recent, in order
    assert estimate_tokens(sent, None, 3) <= budget
    assert msgs[1]["content"] == "Request: do it"  # the caller's conversation is not touched


def test_the_latest_tool_results_are_cut_when_dropping_is_not_enough() -> None:
    msgs = conversation(1, result="z" * 20_000)
    fitted = fit_to_window(msgs, budget=1000, chars_per_token=3)
    assert fitted.clipped == 1 and fitted.fits
    tool = fitted.messages[-1]
    assert tool["role"] == "tool" and "characters cut to fit the context window]" in tool["content"]
    assert estimate_tokens(fitted.messages, None, 3) <= 1000


def test_what_cannot_fit_is_sent_and_said() -> None:
    msgs = [{"role": "system", "content": "S" * 9000}, {"role": "user", "content": "do it"}]
    fitted = fit_to_window(msgs, budget=100, chars_per_token=3)
    assert not fitted.fits and fitted.messages == msgs  # the system prompt and the request are never cut


def test_tool_schemas_count_against_the_budget() -> None:
    msgs = conversation(4)
    schemas = [{"type": "function", "function": {"name": "t", "description": "d" * 3000, "parameters": {}}}]
    without = fit_to_window(msgs, budget=1500, chars_per_token=3)
    with_tools = fit_to_window(msgs, budget=1500, chars_per_token=3, tool_schemas=schemas)
    assert not without.trimmed and with_tools.dropped > 0


def test_prompt_budget_leaves_room_for_the_reply() -> None:
    assert prompt_budget(8192, 1024) == int((8192 - 1024) * 0.95)
    assert prompt_budget(4096, None) == int(4096 * 0.95)


def test_max_tokens_must_leave_room_in_the_window() -> None:
    with pytest.raises(ConfigError, match=r"llm.max_tokens \(8192\) must be smaller than llm.context_window \(8192\)"):
        load_settings(overrides={"llm.max_tokens": 8192})
    assert load_settings(overrides={"llm.context_window": 32768, "llm.max_tokens": 8192}).llm.max_tokens == 8192


@settings(max_examples=60, deadline=None)
@given(
    turns=st.integers(0, 12),
    sizes=st.lists(st.integers(0, 3000), min_size=12, max_size=12),
    budget=st.integers(50, 4000),
    prose=st.booleans(),
)
def test_every_tool_result_keeps_its_call_and_the_head_is_kept(
    turns: int, sizes: list[int], budget: int, prose: bool
) -> None:
    msgs = [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "Request"}]
    for i in range(turns):
        msgs += turn(i, "x" * sizes[i])
        if prose and i % 3 == 1:
            msgs += [{"role": "assistant", "content": "thinking"}, {"role": "user", "content": "go on"}]
    fitted = fit_to_window(msgs, budget=budget, chars_per_token=3.5)
    sent = fitted.messages
    assert sent[0] == msgs[0] and sent[1]["content"].startswith("Request")
    calls = {c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in calls for m in sent if m["role"] == "tool")
    for i, m in enumerate(sent):
        if m["role"] == "assistant" and m.get("tool_calls"):
            assert sent[i + 1]["role"] == "tool"
    if fitted.fits:
        assert estimate_tokens(sent, None, 3.5) <= budget
    json.dumps(sent)
