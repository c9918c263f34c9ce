"""The in-process MCP server of the queue tests (``queue_tool:app``): steps that append to files.

``step`` appends ``line`` and the process id to ``path`` *first*, then works
for ``seconds``: a worker killed during that time has run the step's command
without committing the step, which is the in-flight step the tests allow to
show twice. With ``needs`` naming a file that does not exist, it fails.
"""

from __future__ import annotations

import asyncio
import os
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("steps", log_level="WARNING")


@app.tool()
async def step(path: str, line: str, seconds: float = 0.0, needs: str = "") -> str:
    """Append ``line pid start end`` to ``path`` around ``seconds`` of work; fail when ``needs`` is missing."""
    if needs and not os.path.exists(needs):
        raise ToolError(f"{needs} does not exist")
    start = time.time()
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{line} {os.getpid()} {start:.3f}\n")
    await asyncio.sleep(seconds)
    with open(path + ".ends", "a", encoding="utf-8") as fh:
        fh.write(f"{line} {os.getpid()} {start:.3f} {time.time():.3f}\n")
    return "ok"
