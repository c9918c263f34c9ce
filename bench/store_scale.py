"""Store at scale: what a commit costs when the session carries a big plan, and how much disk
10^4 real sessions take. Issue 21's store targets, measured the same way before and after.

    .venv/bin/python bench/store_scale.py                          # both parts, SQLite (+ PostgreSQL if set)
    .venv/bin/python bench/store_scale.py --part commit --depths 1000,30000 --commits 300
    .venv/bin/python bench/store_scale.py --part size --sessions 10000
    .venv/bin/python bench/store_scale.py --postgres-url postgresql://postgres@127.0.0.1:5432/test

Part ``commit`` -- *a commit with a 2 MB plan in the session costs <= 1.2x a commit with a tiny one,
at 1,000 and at 30,000 steps*. For each backend, plan (tiny: ~200 bytes; big: ``--plan-mb``
MB of padded plan steps in the session's meta, as ``saucer run --plan`` stores it) and depth:
a session whose log already holds ``depth`` engine-shaped step events (imported in one
transaction, with a snapshot at its head, so that building it does not dominate the run),
then ``--commits`` durable commits through a Context, each a step as the engine makes one
(three counter operations, a value, a step record with a command and its result in the
meta). Printed: the mean, median and p90 ms per commit, the KB read and written per commit
by this process (``/proc/self/io``: for SQLite its file and WAL; for PostgreSQL the server does
the I/O, so they say little), and big/tiny of the means.

Part ``size`` -- *the file for 10^4 sessions is at most 60% of today's size for the same data*.
One real follower session (a 3-step plan on the built-in ``files`` tools, through the real
engine) is recorded, then stored ``--sessions`` times under new ids (its events and
snapshots as they are, imported session by session) into a fresh SQLite file. Printed:
the file's size, bytes per session, and the page statistics of its biggest tables.

Each figure says what it is; runs on ``--dir`` (default ``<repo>/.saucer/bench``, the
repository's disk, not a tmpfs). The same script runs on an older checkout (it uses only
public API available before issue 21), so before and after are one command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
try:
    import saucer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(REPO / "src"))

from saucer.context import Context  # noqa: E402
from saucer.store import Event, SessionInfo, Snapshot, open_store  # noqa: E402

# ------------------------------------------------------------------ commits


def _plan(mb: float) -> dict[str, Any]:
    """A plan as the engine stores it in a session's meta: ``mb`` MB of padded steps (0: a tiny one)."""
    steps = 1000 if mb else 2
    pad = "x" * max(0, int(mb * 1e6 / steps) - 80) if mb else ""
    return {
        "task": "bench",
        "steps": [
            {"subtask": f"step {i} {pad}", "commands": [{"tool_name": "files.stat", "parameters": {"path": "."}}]}
            for i in range(steps)
        ],
    }


def _step_meta(i: int) -> dict[str, Any]:
    return {
        "kind": "step",
        "agent": "follower",
        "state": "CONTINUE",
        "status": "CONTINUE",
        "session_status": "running",
        "commands": [{"tool_name": "files.stat", "parameters": {"path": "."}}],
        "results": [{"status": "success", "result": {"path": ".", "size": 4096, "mode": "drwxr-xr-x", "i": i}}],
        "cursor": {"phase": "step", "round": i, "plan_index": i},
    }


def _step_ops(i: int) -> list[dict[str, Any]]:
    return [
        {"op": "incr", "name": "SESSION_STEP", "by": 1},
        {"op": "set", "name": "SUBTASK", "value": f"step {i}"},
        {"op": "set", "var": "last", "value": i},
    ]


def _history(sid: str, depth: int) -> tuple[list[Event], Snapshot]:
    now = time.time()
    events = [Event(sid, v, now, "follower", v, v, _step_ops(v), _step_meta(v)) for v in range(1, depth + 1)]
    state = {"names": {"SESSION_STEP": depth, "SUBTASK": f"step {depth}"}, "vars": {"last": depth}}
    return events, Snapshot(sid, depth, now, state)


def _io() -> tuple[int, int]:
    """Bytes this process has read and written through system calls (files and sockets alike)."""
    try:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    except OSError:
        return 0, 0
    return int(fields["rchar"]), int(fields["wchar"])


def measure_commits(url: str, plan_mb: float, depth: int, commits: int) -> tuple[list[float], float, float]:
    """ms per durable commit of ``commits`` engine-shaped steps on a session of ``depth`` events,
    and the KB this process read and wrote per commit (SQLite: its file and WAL; PostgreSQL: its socket)."""
    sid = f"commit-{uuid.uuid4().hex[:8]}"
    with open_store(url) as store:
        meta = {"task": "bench", "mode": "follower", "request": "", "status": "running", "plan": _plan(plan_mb)}
        events, snapshot = _history(sid, depth)
        store.import_log(SessionInfo(sid, depth, time.time(), time.time(), None, None, meta), events, [snapshot])
        ctx = Context.open(store, sid, author="follower")
        times = []
        read = written = 0
        for i in range(depth + 1, depth + commits + 1):
            for op in _step_ops(i):
                if op["op"] == "incr":
                    ctx.incr(op["name"], op["by"])
            ctx.set("SUBTASK", f"step {i}")
            ctx.update_vars(set={"last": i})
            io = _io()
            started = time.perf_counter()
            ctx.commit(author="follower", round=i, step=i, meta=_step_meta(i))
            times.append((time.perf_counter() - started) * 1e3)
            after = _io()
            read, written = read + after[0] - io[0], written + after[1] - io[1]
        ctx.close()
    return times, read / commits / 1e3, written / commits / 1e3


def part_commit(urls: dict[str, str], args: argparse.Namespace) -> None:
    print(f"\n## commit cost with a big plan in the session ({args.commits} durable commits each)\n")
    print("ms per commit (fsync-bound, so medians move in steps of the disk's flush time: the mean is the")
    print("figure to compare); KB read and written per commit by this process through system calls.\n")
    print(
        f"{'backend':<11} {'steps':>7} {'plan':>8} {'mean':>7} {'median':>7} {'p90':>7} {'KB read':>8} {'KB written':>10} {'big/tiny':>9}"
    )
    for name, url in urls.items():
        for depth in args.depths:
            means = {}
            for label, mb in (("tiny", 0.0), (f"{args.plan_mb:g} MB", args.plan_mb)):
                times, kb_read, kb_written = measure_commits(url, mb, depth, args.commits)
                times.sort()
                means[label] = statistics.fmean(times)
                p90 = times[int(len(times) * 0.9)]
                ratio = f"{means[label] / means['tiny']:.2f}x" if label != "tiny" else ""
                print(
                    f"{name:<11} {depth:>7,} {label:>8} {means[label]:>7.2f} {statistics.median(times):>7.2f} {p90:>7.2f} "
                    f"{kb_read:>8.1f} {kb_written:>10.1f} {ratio:>9}",
                    flush=True,
                )


# --------------------------------------------------------------------- size


def _record_template(directory: Path) -> tuple[SessionInfo, list[Event], list[Snapshot]]:
    """One real 3-step follower session (built-in files tools, the real engine), read back whole."""
    from saucer.config import load_settings
    from saucer.dispatch.shared import share_tool_servers
    from saucer.engine.factory import SessionFactory

    workspace = directory / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{directory / 'template.db'}"
    settings = load_settings(
        overrides={
            "store.url": url,
            "logs.enabled": False,
            "logs.root": str(directory / "logs"),
            "system.save_experience": "always_not",
            "system.log_to_markdown": False,
        }
    )
    plan = {
        "task": "task-7",
        "steps": [
            {
                "subtask": "write a note",
                "commands": [{"tool_name": "files.write", "parameters": {"path": "n7.txt", "content": "note 7\n"}}],
            },
            {"subtask": "read it back", "commands": [{"tool_name": "files.read", "parameters": {"path": "n7.txt"}}]},
            {"subtask": "look around", "commands": [{"tool_name": "files.stat", "parameters": {"path": "."}}]},
        ],
    }

    async def run(factory: Any, sessions: list[Any]) -> Any:
        async with share_tool_servers():
            await factory.check_plans(sessions)
            return await sessions[0].run()

    with SessionFactory(settings, workspace=workspace) as factory:
        sessions = factory.create_session(plan["task"], "follower", plan=plan, session_id="template")
        result = asyncio.run(run(factory, sessions))
    if not result.ok:
        raise SystemExit(f"the template session did not finish: {result}")
    with open_store(url) as store:
        info = store.session_info("template")
        events = list(store.read("template"))
        snaps = []
        for version in sorted(store.record_formats("template")[1]):
            snap = store.latest_snapshot("template", version)
            if snap is not None and snap.version == version:
                snaps.append(snap)
    return info, events, snaps


def _table_pages(path: Path) -> list[tuple[str, int, int, int]]:
    """``(table, pages, overflow pages, unused bytes)`` per table, when SQLite has ``dbstat``."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT name, count(*), sum(pagetype = 'overflow'), sum(unused) FROM dbstat GROUP BY name ORDER BY count(*) DESC"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def part_size(directory: Path, args: argparse.Namespace) -> None:
    from dataclasses import replace

    print(f"\n## disk for {args.sessions:,} real sessions (one engine session stored {args.sessions:,} times)\n")
    work = Path(tempfile.mkdtemp(prefix="size-", dir=directory))
    info, events, snaps = _record_template(work)
    payload = sum(len(repr(e.ops)) + len(repr(e.meta)) for e in events)
    print(f"template: {len(events)} events, {len(snaps)} snapshots, ~{payload:,} characters of ops and meta")
    path = work / "sessions.db"
    url = f"sqlite:///{path}"
    started = time.perf_counter()
    with open_store(url) as store:
        for i in range(args.sessions):
            sid = f"s{i:06d}"
            store.import_log(
                replace(info, session_id=sid),
                [replace(e, session_id=sid) for e in events],
                [replace(s, session_id=sid) for s in snaps],
            )
    build = time.perf_counter() - started
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    size = path.stat().st_size
    print(
        f"file: {size:,} bytes ({size / 1e6:.1f} MB), {size / args.sessions:,.0f} bytes per session, "
        f"page size {page_size}, built in {build:.1f} s"
    )
    for name, pages, overflow, unused in _table_pages(path)[:6]:
        print(f"  {name:<28} {pages:>8,} pages  {overflow or 0:>8,} overflow  {(unused or 0) / 1e6:>8.1f} MB unused")
    with open_store(url) as store:  # a fresh process would pay the same: one query each
        for label, call in (
            ("session_heads() (every row with its newest event)", lambda: store.session_heads()),
            ("list_sessions() (the kept summaries)", lambda: store.list_sessions()),
            ("list_sessions(limit=50, status='finished')", lambda: store.list_sessions(limit=50, status="finished")),
        ):
            if not hasattr(store, label.split("(")[0]):
                print(f"listing: {label}: not in this saucer")
                continue
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                rows = call()
                runs.append(time.perf_counter() - started)
            print(f"listing: {label}: {min(runs) * 1e3:,.0f} ms for {len(rows):,} rows (best of 3)")
    if not args.keep:
        for leftover in sorted(work.rglob("*"), reverse=True):
            leftover.unlink() if leftover.is_file() else leftover.rmdir()
        work.rmdir()


# --------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--part", choices=("commit", "size", "all"), default="all")
    parser.add_argument("--dir", type=Path, default=REPO / ".saucer" / "bench")
    parser.add_argument("--depths", default="1000,30000", help="session lengths (events) to commit at")
    parser.add_argument("--commits", type=int, default=300, help="commits measured per case")
    parser.add_argument("--plan-mb", type=float, default=2.0)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--keep", action="store_true", help="keep the files of part size")
    parser.add_argument("--postgres-url", default=os.environ.get("SAUCER_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    args.depths = [int(d) for d in args.depths.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    print(
        f"# store at scale -- Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    schema = None
    if args.part in ("commit", "all"):
        work = Path(tempfile.mkdtemp(prefix="commit-", dir=args.dir))
        urls = {"sqlite": f"sqlite:///{work / 'commit.db'}"}
        if args.postgres_url:
            schema = f"bench_scale_{uuid.uuid4().hex[:8]}"
            urls["postgresql"] = f"{args.postgres_url}{'&' if '?' in args.postgres_url else '?'}schema={schema}"
        try:
            part_commit(urls, args)
        finally:
            for leftover in work.iterdir():
                leftover.unlink()
            work.rmdir()
            if schema is not None:
                import psycopg

                with psycopg.connect(args.postgres_url, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if args.part in ("size", "all"):
        part_size(args.dir, args)


if __name__ == "__main__":
    main()
