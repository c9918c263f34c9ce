"""A worker process for ``test_leases_multiprocess``: lease one session and run its steps.

    python lease_worker.py URL SESSION OWNER --steps N --ttl SECONDS --delay SECONDS
                           [--wait] [--pause-after STEP --pause SECONDS]

Each step increments the context variable ``step`` and appends the step's
index to ``done``, commits with the lease token, then renews the lease. With
``--pause-after K`` the worker stalls for ``--pause`` seconds after committing
step K without renewing (a long GC pause, a frozen VM), then goes straight on
to commit the next step, as a worker that does not know it lost its lease.

Prints one line per fact, flushed: ``HELD <holder>``, ``LEASED <token>``,
``STEP <i>``, ``PAUSED``, ``FENCED <holder> <token>``, ``LOST <holder>``, ``DONE``.
Exit status: 0 done, 2 lease held (without ``--wait``), 3 fenced, 4 lease lost.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("session")
    ap.add_argument("owner")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ttl", type=float, required=True)
    ap.add_argument("--delay", type=float, default=0.05)
    ap.add_argument("--wait", action="store_true", help="retry until the lease is free")
    ap.add_argument("--pause-after", type=int)
    ap.add_argument("--pause", type=float, default=0.0)
    args = ap.parse_args()

    from saucer.context import Context
    from saucer.store import FencedError, LeaseHeldError, open_store

    def say(line: str) -> None:
        print(line, flush=True)

    store = open_store(args.url)
    reported = False
    while True:
        try:
            lease = store.acquire_lease(args.session, args.owner, args.ttl)
            break
        except LeaseHeldError as exc:
            if not reported:
                say(f"HELD {exc.holder}")
                reported = True
            if not args.wait:
                return 2
            time.sleep(0.05)
    say(f"LEASED {lease.token}")
    # Opened after the lease is ours: the state includes every step committed before.
    ctx = Context.open(store, args.session, author=args.owner, fence=lease.token)
    while True:
        step = ctx.get_var("step") or 0
        if step >= args.steps:
            break
        ctx.incr("step")
        ctx.append("done", step)
        try:
            ctx.commit(step=step)
        except FencedError as exc:
            say(f"FENCED {exc.holder} {exc.actual}")
            return 3
        say(f"STEP {step}")
        if args.pause_after is not None and step == args.pause_after:
            say("PAUSED")
            time.sleep(args.pause)
            continue  # straight to the next commit, with the old token
        time.sleep(args.delay)
        try:
            lease = store.acquire_lease(args.session, args.owner, args.ttl)
        except LeaseHeldError as exc:
            say(f"LOST {exc.holder}")
            return 4
        ctx.fence = lease.token
    store.release_lease(lease)
    say("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
