"""Runs (or resumes) a follower session that can be killed between its merged lifecycle commits.

Used by test_engine_lifecycle_crash.py as a child process killed with SIGKILL::

    python lifecycle_child.py run|resume DB_URL SESSION_ID PLAN_FILE LINES_FILE LOGS_ROOT HOLD_ROUND MARKER

With ``HOLD_ROUND`` >= 0 (``run`` only), the observer's ``on_round_end`` of that round writes
``MARKER`` and sleeps: the round's step is committed, its end and evaluation are deferred (not
written yet), which is where the parent kills the process.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from follower_child import run_or_resume


class _HoldAtRoundEnd:
    def __init__(self, round_id: int, marker: str) -> None:
        self.round_id = round_id
        self.marker = marker

    def on_round_end(self, session: Any, round: Any, result: Any) -> None:
        if round.id == self.round_id:
            Path(self.marker).write_text(str(session.context.version))
            time.sleep(60)  # killed meanwhile


def main(argv: list[str]) -> int:
    hold_round, marker = int(argv[6]), argv[7]
    return run_or_resume(
        argv[:6],
        name="lifecycle",
        overrides={"system.eva_round": True},  # a round's end and its evaluation, both deferred
        observer=_HoldAtRoundEnd(hold_round, marker) if hold_round >= 0 else None,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
