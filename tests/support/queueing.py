"""Helpers of the queue tests: plans whose steps append to files, the processes' environment, polling the queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: The queue tests' folder: worker processes import its test tool (queue_tool.py) from it.
QUEUE_TESTS = Path(__file__).resolve().parents[1] / "queue"
SAUCER = [sys.executable, "-m", "saucer"]


def write_plans(
    folder: Path, count: int, steps: int, out: Path, seconds: float = 0.0, needs: str = "", prefix: str = "p"
) -> list[Path]:
    """``count`` plans, each of ``steps`` steps appending ``<plan>-s<i>`` to ``out``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(count):
        name = f"{prefix}{n:02d}"
        plan = {
            "task": f"append {name}",
            "steps": [
                {
                    "subtask": f"step {i}",
                    "commands": [
                        {
                            "tool_name": "steps.step",
                            "parameters": {
                                "path": str(out),
                                "line": f"{name}-s{i}",
                                "seconds": seconds,
                                "needs": needs,
                            },
                        }
                    ],
                }
                for i in range(steps)
            ],
        }
        path = folder / f"{name}.json"
        path.write_text(json.dumps(plan), encoding="utf-8")
        paths.append(path)
    return paths


CONFIG = """
[mcp.servers.steps]
import_path = "queue_tool:app"

[system]
save_experience = "always_not"
log_to_markdown = false
"""


def queue_env(url: str, **settings: Any) -> dict[str, str]:
    """The environment of a saucer process of these tests: the store, short leases and heartbeats, the test tool."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env.update(
        {
            "SAUCER_STORE_URL": url,
            "SAUCER_STORE__LEASE_TTL": "3",
            "SAUCER_QUEUE__HEARTBEAT": "0.5",
            "SAUCER_QUEUE__STALLED_AFTER": "4",
            "SAUCER_QUEUE__SHUTDOWN_TIMEOUT": "0",
            "PYTHONPATH": os.pathsep.join([str(QUEUE_TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "COLUMNS": "200",
            "NO_COLOR": "1",
        }
    )
    env.update({f"SAUCER_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def status_json(saucer: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    """``saucer queue status --json``, parsed."""
    proc = saucer("queue", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def status_here(url: str) -> dict[str, Any]:
    """What ``saucer queue status --json`` prints, read in this process (cheaper than a CLI process per poll)."""
    import asyncio

    from saucer.config import load_settings
    from saucer.queue import QueueClient, queue_status
    from saucer.store import open_store

    async def read() -> dict[str, Any]:
        with open_store(url) as store:
            async with QueueClient(load_settings(overrides={"store.url": url}), store) as client:
                return (await queue_status(client)).to_dict()

    return asyncio.run(read())


def counts(url: str) -> dict[str, int]:
    """The queue's counts, read in this process."""
    return status_here(url)["counts"]
