"""Opening a long engine session: what a resume reads before its first step, timed in fresh processes.

    .venv/bin/python bench/engine_open.py              # a session of 100,000 engine steps
    .venv/bin/python bench/engine_open.py --quick      # 10,000 steps
    .venv/bin/python bench/engine_open.py --steps N --repeat R

The session is real engine steps (``Session.run``, a no-op agent, every
default: durability ``step``, ``STRUCTURAL_LOGS`` entry per step, snapshots
every 100 events spaced by size) on SQLite. It is built on tmpfs when
``/dev/shm`` exists (one fsync per step would take minutes on a disk), then
copied to a temporary directory on disk, where it is opened.

Two sessions are built: ``closed`` ends normally (a snapshot at its head);
``killed`` is SIGKILLed (``os._exit``) inside a step near its end, so opening it
replays the events since its last automatic snapshot (its dead runner's lease
is marked expired, as it is ``store.lease_ttl`` seconds later). Each is opened as it is
(large values *packed* in their snapshots, decoded when first read) and with
its snapshots rewritten without packed values (every value decoded when the
session is opened: what saucer wrote before record format 3; the other changes
of later formats, such as compression, are kept).

Each figure is one fresh process (saucer imported before the clock starts),
median and best of ``--repeat`` runs:

- ``open``: ``open_store`` + what ``Session.resume`` reads (the stored session
  meta without its plan, read when a step of it is first needed; the newest
  cursor) + ``Context.open`` of the session at its head;
- ``+ read logs``: then ``ctx.get(STRUCTURAL_LOGS)`` (decodes a packed value);
- ``resume``: ``Session.resume(...).run()`` until its agent is called (lease,
  cursor, Context, logs, dispatcher and the resume commit included); for the
  ``closed`` session, which has ended, until it returns its stored result.

Target (issue 21): opening a 10^5-event engine session <= 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

SID = "long"


def _settings(url: str, steps: int) -> Any:
    from saucer.config import load_settings

    return load_settings(
        overrides={
            "store.url": url,
            "logs.enabled": False,
            "system.max_step": steps + 10,
            "system.save_experience": "always_not",
        }
    )


def build(path: str, steps: int, kill_at: int | None) -> None:
    """Run the session (in this process); ``kill_at``: exit without cleanup inside that step."""
    from saucer.engine import Agent, AgentStatus, Session

    class Noop(Agent):
        def __init__(self) -> None:
            super().__init__("noop")
            self.n = 0

        async def act(self, context: Any) -> Any:
            self.n += 1
            if self.n == kill_at:
                os._exit(137)  # as SIGKILL would: nothing flushed, nothing closed
            return AgentStatus.FINISH if self.n >= steps else None

    session = Session(
        "bench-open", settings=_settings(f"sqlite:///{path}", steps), request="go", agents=Noop(), session_id=SID
    )
    result = asyncio.run(session.run())
    assert result.ok and result.steps == steps, result


def unpack_snapshots(path: str) -> int:
    """Rewrite the session's snapshots with every value plain (as record format 2 stored them)."""
    import orjson

    from saucer.context.events import state_from_wire, state_to_wire
    from saucer.store.upcast import FORMAT_VERSION

    count = 0
    with sqlite3.connect(path) as conn:
        for version, blob in conn.execute(
            "SELECT version, state FROM snapshots WHERE session_id = ?", (SID,)
        ).fetchall():
            data = orjson.loads(zlib.decompress(blob) if blob[:1] != b"{" else blob)
            data.pop("v")
            plain = zlib.compress(orjson.dumps({"v": FORMAT_VERSION, **state_to_wire(state_from_wire(data))}), 1)
            conn.execute(
                "UPDATE snapshots SET state = ?, crc = ? WHERE session_id = ? AND version = ?",
                (plain, zlib.crc32(plain), SID, version),
            )
            count += 1
    return count


def measure_open(path: str) -> dict[str, float]:
    import saucer.store.sqlite  # noqa: F401 - imported before the clock, as in a running program
    from saucer.context import Context, ContextNames
    from saucer.engine.cursor import last_cursor, stored_session_brief
    from saucer.store import open_store

    t0 = time.perf_counter()
    store = open_store(f"sqlite:///{path}")
    stored_session_brief(store, SID)  # what Session.resume reads: the meta without its plan
    last_cursor(store, SID)
    ctx = Context.open(store, SID, create=False)
    t1 = time.perf_counter()
    logs = ctx.get(ContextNames.STRUCTURAL_LOGS)
    t2 = time.perf_counter()
    assert sum(len(v) for r in logs.values() for v in r.values()) == ctx.get(ContextNames.SESSION_STEP)
    out = {
        "open_ms": (t1 - t0) * 1e3,
        "logs_ms": (t2 - t0) * 1e3,
        "head": store.head(SID),
        "snapshot": ctx._snapshot_version,
    }
    ctx.close()
    store.close()
    return out


def measure_resume(path: str) -> dict[str, float]:
    import saucer.store.sqlite  # noqa: F401 - imported before the clock, as in a running program
    from saucer.engine import Agent, AgentStatus, Session

    first: list[float] = []

    class Once(Agent):
        async def act(self, context: Any) -> Any:
            first.append(time.perf_counter())
            return AgentStatus.FINISH

    settings = _settings(f"sqlite:///{path}", 10**7)
    t0 = time.perf_counter()
    session = Session.resume(SID, settings=settings, agents=Once("noop"))
    result = asyncio.run(session.run())
    # A session that ended (``closed``) is not run again: its stored result is what resume gives.
    end = first[0] if first else time.perf_counter()
    return {"resume_ms": (end - t0) * 1e3, "ran": bool(first), "status": result.status}


def _fresh(path: Path, copy: Path) -> str:
    """A copy of the SQLite file ``path`` (with its WAL) at ``copy``, replacing an older one."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)
        if Path(f"{path}{suffix}").exists():
            shutil.copyfile(f"{path}{suffix}", f"{copy}{suffix}")
    return str(copy)


def _child(*args: str) -> dict[str, Any]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True, env=env
    )
    if args[0] == "--build" and proc.returncode in (0, 137):
        return {}
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="engine steps of the session (default 100,000)")
    parser.add_argument("--quick", action="store_true", help="10,000 steps")
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per figure (default 5)")
    parser.add_argument("--build", nargs=3, metavar=("PATH", "STEPS", "KILL_AT"), help=argparse.SUPPRESS)
    parser.add_argument("--open", dest="open_path", help=argparse.SUPPRESS)
    parser.add_argument("--resume", dest="resume_path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        path, steps, kill_at = args.build
        build(path, int(steps), int(kill_at) or None)
        return 0
    if args.open_path:
        print(json.dumps(measure_open(args.open_path)))
        return 0
    if args.resume_path:
        print(json.dumps(measure_resume(args.resume_path)))
        return 0

    steps = args.steps or (10_000 if args.quick else 100_000)
    shm = Path("/dev/shm")
    build_dir = Path(tempfile.mkdtemp(prefix="saucer-open-", dir=shm if shm.is_dir() else None))
    disk_dir = Path(tempfile.mkdtemp(prefix="saucer-open-"))
    rows = []
    try:
        for label, kill_at in (("closed", 0), ("killed", steps - 7)):
            built = build_dir / f"{label}.db"
            t = time.perf_counter()
            _child("--build", str(built), str(steps), str(kill_at))
            built_s = time.perf_counter() - t
            with sqlite3.connect(built) as conn:  # the killed runner's lease, as if its ttl had passed
                conn.execute("UPDATE leases SET expires_at = 0")
            for form in ("packed", "unpacked"):
                path = disk_dir / f"{label}-{form}.db"
                _fresh(built, path)
                if form == "unpacked":
                    unpack_snapshots(str(path))
                # Each run gets a fresh copy: closing a Context may store a snapshot, and a resume writes.
                opens = [_child("--open", _fresh(path, disk_dir / "run.db")) for _ in range(args.repeat)]
                resumes = [_child("--resume", _fresh(path, disk_dir / "run.db")) for _ in range(args.repeat)]
                rows.append((label, form, opens, resumes, built_s))
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
        shutil.rmtree(disk_dir, ignore_errors=True)

    print(
        f"saucer engine open benchmark: a session of {steps:,} engine steps on SQLite "
        f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs), median (best) of {args.repeat} fresh processes"
    )
    print(
        f"{'session':<8} {'snapshots':<9} {'events':>8} {'tail':>7} {'open ms':>15} {'+ read logs ms':>17} {'resume ms':>19}"
    )
    for label, form, opens, resumes, _built_s in rows:

        def fig(values: list[float]) -> str:
            return f"{statistics.median(values):8.1f} ({min(values):.1f})"

        head, snap = opens[0]["head"], opens[0]["snapshot"]
        print(
            f"{label:<8} {form:<9} {head:>8,} {head - snap:>7,} {fig([o['open_ms'] for o in opens]):>15} "
            f"{fig([o['logs_ms'] for o in opens]):>17} {fig([r['resume_ms'] for r in resumes]):>19}"
        )
    print(
        "tail: events after the snapshot the open starts from. packed: as saucer writes snapshots now; unpacked: "
        "the same snapshots with every value plain (as before record format 3). Target: open <= 20 ms at 10^5 events. "
        f"Load average at the end: {os.getloadavg()[0]:.2f}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
