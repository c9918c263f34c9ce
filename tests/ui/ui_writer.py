"""A separate process that commits steps to a session, slowly: ``python ui_writer.py STORE_URL SESSION STEPS DELAY``."""

from __future__ import annotations

import sys
import time

from saucer.context import Context
from saucer.engine.summaries import summary_of
from saucer.store import open_store


def main() -> None:
    url, sid, steps, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with open_store(url) as store:
        ctx = Context.open(store, sid, author="writer")
        for i in range(1, steps + 1):
            time.sleep(delay)
            ctx.incr("n")
            ctx.commit_step(
                author="agent",
                meta={
                    "kind": "step",
                    "round": 1,
                    "step": i,
                    "session_step": i,
                    "agent": "writer",
                    "state": "CONTINUE",
                    "status": "CONTINUE",
                    "commands": [{"tool_name": "echo", "parameters": {"live": i}}],
                    "results": [{"status": "success", "result": f"live step {i} <done>"}],
                },
            )
            print(f"committed v{ctx.version}", flush=True)
        time.sleep(delay)
        end = {"kind": "session_end", "session_status": "finished", "summary": {"steps": steps}}
        ctx.commit_step(author="system", meta=end, summary=summary_of(end))
        ctx.close()


if __name__ == "__main__":
    main()
