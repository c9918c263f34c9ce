"""``saucer show`` of an LLM step: the model's replies and tool calls as a conversation, never the
variables that hold it (issue 33, item 3)."""

from __future__ import annotations

from saucer.cli.conversation import conversation_lines
from saucer.cli.inspect import PlainText
from saucer.cli.timeline import timeline_entries
from saucer.store import Event

CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "files__write", "arguments": '{"path": "notes.txt", "content": "hello"}'},
}


def _step(ops: list[dict]) -> Event:
    return Event("s", 3, 0.0, "app", 0, 1, ops, {"kind": "step", "agent": "app", "session_step": 1})


def test_an_llm_step_reads_as_a_conversation() -> None:
    event = _step(
        [
            {
                "op": "set",
                "var": "_llm.app.messages",
                "value": [
                    {"role": "system", "content": "You are..."},
                    {"role": "user", "content": "create notes.txt containing hello, then show it"},
                ],
            },
            {
                "op": "append",
                "var": "_llm.app.messages",
                "value": {"role": "assistant", "content": "", "tool_calls": [CALL]},
            },
            {
                "op": "append",
                "var": "_llm.app.messages",
                "value": {"role": "tool", "tool_call_id": "c1", "content": "wrote 5 bytes"},
            },
            {
                "op": "append",
                "var": "_llm.app.messages",
                "value": {"role": "assistant", "content": "Done: notes.txt says hello."},
            },
            {"op": "set", "var": "_llm.app.meta", "value": {"failures": 0}},
            {"op": "incr", "var": "_llm.tokens", "by": 1699},
        ]
    )
    assert conversation_lines(event) == [
        "user → app: create notes.txt containing hello, then show it",
        'app calls files__write {"path": "notes.txt", "content": "hello"}',
        "  ↳ wrote 5 bytes",
        "app says: Done: notes.txt says hello.",
    ]
    [(_, _, _, lines)] = list(timeline_entries([event], text=PlainText))
    text = "\n".join(line.plain for line in lines)
    assert "app calls files__write" in text and "app says: Done" in text
    assert "_llm" not in text and "+=" not in text  # never the internal variables
