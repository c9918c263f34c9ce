"""Runs (or resumes) a follower session that can be killed between its merged lifecycle commits.

Used by test_engine_lifecycle_crash.py as a child process killed with SIGKILL::

    python lifecycle_child.py run|resume DB_URL SESSION_ID PLAN_FILE LINES_FILE LOGS_ROOT HOLD_ROUND MARKER

With ``HOLD_ROUND`` >= 0 (``run`` only), the observer's ``on_round_end`` of that round writes
``MARKER`` and sleeps: the round's step is committed, its end and evaluation are deferred (not
written yet), which is where the parent kills the process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from follower_child import AppendingDispatcher

from saucer.config import load_settings
from saucer.engine import Session


class _HoldAtRoundEnd:
    def __init__(self, round_id: int, marker: str) -> None:
        self.round_id = round_id
        self.marker = marker

    def on_round_end(self, session: Any, round: Any, result: Any) -> None:
        if round.id == self.round_id:
            Path(self.marker).write_text(str(session.context.version))
            time.sleep(60)  # killed meanwhile


def main(argv: list[str]) -> int:
    action, db_url, session_id, plan_file, lines_file, logs_root, hold_round, marker = argv
    settings = load_settings(
        overrides={
            "store.url": db_url,
            "store.lease_ttl": 1.0,
            "logs.root": logs_root,
            "system.max_round": 0,
            "system.eva_round": True,  # a round's end and its evaluation, both deferred
            "system.save_experience": "always_not",
        }
    )
    dispatcher = AppendingDispatcher(lines_file)
    observer = _HoldAtRoundEnd(int(hold_round), marker) if int(hold_round) >= 0 else None
    if action == "run":
        with open(plan_file, encoding="utf-8") as fh:
            plan = json.load(fh)
        session = Session(
            "lifecycle",
            mode="follower",
            settings=settings,
            session_id=session_id,
            plan=plan,
            plan_file=plan_file,
            dispatcher=dispatcher,
            observer=observer,
        )
    else:
        session = Session.resume(session_id, settings=settings, dispatcher=dispatcher, lease_wait=10.0)
    result = asyncio.run(session.run())
    print(json.dumps(result.to_dict()))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
