"""The viewer's tests: stores (the shipped demo, sessions written through the Context, many sessions) and a
viewer server in a thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from saucer.context import Context
from saucer.engine.summaries import summary_of
from saucer.store import EventStore

SAUCER = [sys.executable, "-m", "saucer"]
HOSTILE = "<script>alert('x')</script> {{ 7*7 }} & \"q\" <b>bold</b>"


def run_demo(folder: Path, store_url: str) -> str:
    """Run ``saucer demo`` in ``folder`` against ``store_url``; return its session id."""
    proc = subprocess.run(
        [*SAUCER, "demo", "--store", store_url],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if " ui demo-" in line)
    return line.split(" ui ", 1)[1].split()[0]


def write_session(
    store: EventStore,
    sid: str,
    *,
    steps: int = 3,
    task: str = "task",
    request: str = "do it",
    status: str = "finished",
    big: int = 0,
    extra_var: Any = None,
) -> None:
    """A session shaped as the engine writes one: start, a round of steps with commands and results, end."""
    store.create_session(sid, meta={"task": task, "mode": "follower", "request": request, "status": "running"})
    ctx = Context.open(store, sid, author="system")
    ctx.set("REQUEST", request)
    start = {"kind": "session_start", "task": task, "mode": "follower", "session_status": "running"}
    ctx.commit_step(author="system", meta=start, summary=summary_of(start))
    ctx.set("CURRENT_ROUND_ID", 1)
    ctx.commit_step(author="system", meta={"kind": "round_start", "request": request})
    for i in range(1, steps + 1):
        ctx.incr("n")
        if big:
            ctx.update_vars({"big": "x" * big})
        if extra_var is not None:
            ctx.update_vars({"hostile": extra_var})
        ctx.commit_step(
            author="agent",
            meta={
                "kind": "step",
                "round": 1,
                "step": i,
                "session_step": i,
                "agent": "follower",
                "state": "CONTINUE",
                "status": "CONTINUE",
                "commands": [{"tool_name": "files.write", "parameters": {"path": f"f{i}.txt", "content": request}}],
                "results": [{"status": "success", "result": f"wrote f{i}.txt " + request}],
                "cost": 0.001,
            },
            summary=summary_of({"kind": "step", "cost": 0.001}),
        )
    ctx.commit_step(
        author="system",
        meta={"kind": "round_end", "round_status": "finished"},
        summary=summary_of({"kind": "round_end"}),
    )
    if status != "running":
        end = {
            "kind": "session_end",
            "session_status": status,
            "summary": {"rounds": 1, "steps": steps, "cost": 0.001 * steps},
        }
        ctx.commit_step(author="system", meta=end, summary=summary_of(end))
    ctx.close()


def many_sessions(store: EventStore, n: int) -> None:
    """``n`` small sessions (a start and an end event each), different tasks and statuses."""
    for i in range(n):
        sid = f"s{i:05d}"
        store.create_session(
            sid,
            meta={"task": f"task{i % 7}", "mode": "follower", "request": f"request number {i}", "status": "running"},
        )
        store.append(
            sid,
            0,
            [{"op": "set", "name": "REQUEST", "value": f"request number {i}"}],
            author="system",
            meta={"kind": "session_start", "session_status": "running"},
            summary=summary_of({"session_status": "running"}),
        )
        end = {
            "kind": "session_end",
            "session_status": "finished" if i % 3 else "failed",
            "summary": {"rounds": 1, "steps": i % 11, "cost": i / 1000},
        }
        store.append(sid, 1, [], author="system", meta=end, summary=summary_of(end))
        time.sleep(0)  # keep the loop cooperative; updated_at orders them


class ViewerServer:
    """A uvicorn server of an ASGI app on a free loopback port, in a thread."""

    def __init__(self, app: object) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="viewer", daemon=True)

    def __enter__(self) -> ViewerServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the viewer did not start"
            time.sleep(0.02)
        return self

    @property
    def url(self) -> str:
        [sock] = [s for server in self.server.servers for s in server.sockets]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
