"""An MCP server for the dispatcher tests: run in-process (``tests.dispatch.dispatch_fixture_server:app``) or over stdio.

As a script (``python dispatch_fixture_server.py``) it serves ``app`` on stdio.
When the file named by ``FIXTURE_REFUSE_START_IF`` exists, the script exits at
once, which lets a test make a restart fail.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

app = MCPServer("fixture", log_level="WARNING")

#: Concurrency seen by ``probe`` (in-process only): current and highest number of overlapping calls.
PROBE = {"current": 0, "max": 0}


@app.tool()
def echo(text: str) -> str:
    """Return ``text`` unchanged."""
    return text


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep ``seconds``, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@app.tool()
def fail(message: str) -> str:
    """Always fail with ``message`` (an anticipated tool error)."""
    raise ToolError(message)


@app.tool()
def boom() -> str:
    """Crash inside the tool (an unexpected exception)."""
    raise RuntimeError("kaboom")


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
async def probe(seconds: float = 0.2) -> dict[str, Any]:
    """A read-only call that records how many calls overlap."""
    PROBE["current"] += 1
    PROBE["max"] = max(PROBE["max"], PROBE["current"])
    try:
        await asyncio.sleep(seconds)
    finally:
        PROBE["current"] -= 1
    return {"max_seen": PROBE["max"]}


@app.tool()
def run(command: str) -> str:
    """Pretend to run a command line (for sensitivity rules); returns it."""
    return f"ran {command}"


@app.tool()
def exit_now(code: int = 3) -> str:
    """End the server process at once, as a crash would."""
    os._exit(code)


if __name__ == "__main__":
    marker = os.environ.get("FIXTURE_REFUSE_START_IF")
    if marker and os.path.exists(marker):
        sys.exit(7)
    app.run("stdio")
