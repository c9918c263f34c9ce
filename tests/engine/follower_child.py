"""Runs (or resumes) a follower session whose tool appends a line per executed command.

Used by test_engine_resume.py as a child process that is killed with SIGKILL mid-run::

    python follower_child.py run|resume DB_URL SESSION_ID PLAN_FILE LINES_FILE LOGS_ROOT
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from saucer.config import load_settings
from saucer.dispatch.messages import Result, ResultStatus
from saucer.engine import Session

#: How long the tool works after recording its line (the window in which a kill leaves it in flight).
TOOL_SECONDS = 0.05


class AppendingDispatcher:
    """An in-process tool: append ``i`` to the lines file, then work a little."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def execute_commands(self, commands: list[Any], timeout: float | None = None) -> list[Result]:
        out = []
        for command in commands:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(f"{command.parameters['i']}\n")
            await asyncio.sleep(TOOL_SECONDS)
            out.append(Result(status=ResultStatus.SUCCESS, result="ok", call_id=command.call_id))
        return out


def run_or_resume(argv: list[str], *, name: str, overrides: dict[str, Any] | None = None, observer: Any = None) -> int:
    """``run`` (a new session of the plan, named ``name``) or ``resume`` the session; print its result as JSON.

    ``argv`` is ``run|resume DB_URL SESSION_ID PLAN_FILE LINES_FILE LOGS_ROOT``; ``overrides`` go over the
    settings every child uses (1 s lease, no round limit, no experience saved).
    """
    action, db_url, session_id, plan_file, lines_file, logs_root = argv
    settings = load_settings(
        overrides={
            "store.url": db_url,
            "store.lease_ttl": 1.0,
            "logs.root": logs_root,
            "system.max_round": 0,  # no limit: the plan is longer than the default 10 rounds
            "system.save_experience": "always_not",
            **(overrides or {}),
        }
    )
    dispatcher = AppendingDispatcher(lines_file)
    if action == "run":
        with open(plan_file, encoding="utf-8") as fh:
            plan = json.load(fh)
        session = Session(
            name,
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


def main(argv: list[str]) -> int:
    return run_or_resume(argv, name="killme", overrides={"system.max_step": 1000})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
