"""An LLM agent with nobody at a terminal: its sensitive call waits as a pending approval, and the
model reads the decision (a refusal by a person, with the reason) as the call's result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import make_session

from saucer.agents.llm import ModelSettings
from saucer.dispatch.local import LocalCommandDispatcher
from saucer.engine.approvals import decide, pending_approvals, pending_approver
from saucer.engine.interactor import NonInteractiveInteractor


def _notes_server() -> Any:
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("notes", log_level="WARNING")

    @app.tool()
    def delete(path: str) -> str:
        """Delete a note."""
        return f"deleted {path}"

    return app


def test_the_model_reads_a_persons_refusal_of_its_sensitive_call(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(fake.tool_calls(("notes.delete", {"path": "a.txt"}, "d")), fake.text("ok, I left it"))
    interactor = NonInteractiveInteractor()  # a queue worker's: nobody to ask

    async def go() -> Any:
        dispatcher = LocalCommandDispatcher({"notes": _notes_server()}, sensitive_tools=["notes.delete"])
        async with dispatcher:
            session = make_session(
                tmp_path, settings, dispatcher=dispatcher, interactor=interactor, task="llm-approval"
            )
            dispatcher.approver = pending_approver(
                session, interactor, timeout=30, reason_of=dispatcher.sensitive_reason
            )

            async def person() -> None:
                while True:
                    store = session.store
                    waiting = (
                        pending_approvals(store, [session.session_id])
                        if store is not None and store.exists(session.session_id)
                        else []
                    )
                    if waiting:
                        assert waiting[0].reason == "tool 'notes.delete' is marked sensitive"
                        decide(
                            store,
                            session.session_id,
                            waiting[0].number,
                            status="refused",
                            author="user:ana",
                            note="keep a.txt",
                        )
                        return
                    await asyncio.sleep(0.02)

            helper = asyncio.create_task(person())
            result = await session.run()
            await helper
            return result

    result = asyncio.run(go())
    assert result.status == "failed" and "every tool call failed or was refused" in result.reason  # nothing was done
    [message] = [m for m in fake.requests[1].json["messages"] if m.get("role") == "tool"]
    assert message["tool_call_id"] == "d"
    assert message["content"].startswith(
        "refused: tool 'notes.delete' (tool 'notes.delete' is marked sensitive): refused by user:ana"
    )
    assert message["content"].endswith(": keep a.txt")
