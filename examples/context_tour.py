"""A tour of the durable Context: write, commit, read history, time-travel and fork.

Run it from anywhere: python examples/context_tour.py
It keeps its store in a temporary directory and prints what it finds.
"""

import tempfile
from pathlib import Path

from saucer.context import Context, ContextNames

with tempfile.TemporaryDirectory() as tmp:
    url = f"sqlite:///{Path(tmp) / 'example.db'}"

    ctx = Context.open(url, "session-1", author="agent:planner")
    ctx.set(ContextNames.CURRENT_ROUND_ID, 1)
    ctx.set(ContextNames.REQUEST, "Tidy the workspace")
    ctx.update_vars(set={"status": "planning"})
    first = ctx.commit()

    ctx.update_vars(set={"status": "working"}, delete=["draft"])
    ctx.incr("retries")
    ctx.append(ContextNames.PREVIOUS_SUBTASKS, "list files")
    ctx.current_round_cost += 0.01
    second = ctx.commit()
    print(f"committed v{first} and v{second}")

    for event in ctx.history("status"):
        print(f"  v{event.version} by {event.author} in round {event.round}: status changed")

    print("diff v1 -> v2:", sorted(ctx.diff(first, second)))
    print("status at v1:", ctx.state_at(first).get_var("status"))

    branch = ctx.fork("session-1-alt", at=first)
    branch.update_vars(set={"status": "abandoned"})
    branch.commit()
    print("fork status:", branch.get_var("status"), "| original:", ctx.get_var("status"))
    branch.close()
    ctx.close()

    reopened = Context.open(url, "session-1")
    print(f"reopened at v{reopened.version}: cost of round 1 = {reopened.current_round_cost:.2f}")
    reopened.close()
