"""Page-load time of the web viewer (``saucer ui``): server time per page, p50 and p90, wall clock and CPU.

Two stores, built once per run (their build time is not measured):

- 10^4 sessions, each with a start and an end event: the sessions page
  (first page, a status filter, a search, sorting by cost, the last page);
- one session with 10^4 steps (each with a command and its result): its page
  (the newest 200 events shown, every round summarised, the path diagram),
  the page with the step inspector open, the inspector's data alone (what a
  click on a step loads), the state at a version in the middle, a diff, the
  history of a key.

Targets (issue 30): each page <= 300 ms server time, the inspector's data <= 100 ms.

Each page is requested ``--repeat`` times through the app in-process
(Starlette's TestClient: no network, so the time is the server's: store
reads, queries, rendering), after one request that warms it; then a fresh
viewer times what a user meets first: the session's page (its whole log
read once), a click on a step in the middle (a hydrate there), and the step
after it (one event from the state the click left).

    .venv/bin/python bench/ui.py [--sessions 10000] [--steps 10000] [--repeat 15] [--postgres-url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from starlette.testclient import TestClient

from saucer.store import EventStore, open_store
from saucer.ui import create_app


def _fill_sessions(store: EventStore, n: int) -> None:
    for i in range(n):
        sid = f"s{i:06d}"
        store.create_session(
            sid, meta={"task": f"task{i % 13}", "mode": "follower", "request": f"request {i}", "status": "running"}
        )
        store.append(
            sid,
            0,
            [{"op": "set", "name": "REQUEST", "value": f"request {i}"}],
            author="system",
            meta={"kind": "session_start", "session_status": "running"},
        )
        store.append(
            sid,
            1,
            [{"op": "set", "name": "ROUND_RESULT", "value": "done"}],
            author="system",
            meta={
                "kind": "session_end",
                "session_status": "finished" if i % 4 else "failed",
                "summary": {"rounds": 1 + i % 3, "steps": i % 17, "cost": i / 10_000},
            },
        )


def _fill_steps(store: EventStore, sid: str, n: int) -> None:
    """A session as the engine writes one, with snapshots every 100 versions (as a Context keeps them)."""
    from saucer.context import Context

    store.create_session(sid, meta={"task": "long", "mode": "follower", "request": "many steps", "status": "running"})
    version = 0
    per_round = 100
    for i in range(n):
        if version and version % 100 == 0:
            ctx = Context.open(store, sid, create=False)
            ctx.snapshot()
            ctx.close()
        rnd = i // per_round + 1
        if i % per_round == 0:
            store.append(
                sid,
                version,
                [{"op": "set", "name": "CURRENT_ROUND_ID", "value": rnd}],
                author="system",
                round=rnd,
                meta={"kind": "round_start", "request": f"round {rnd}"},
            )
            version += 1
        store.append(
            sid,
            version,
            [{"op": "incr", "var": "n", "by": 1}, {"op": "set", "name": "SUBTASK", "value": f"step {i}"}],
            author="agent",
            round=rnd,
            step=i % per_round + 1,
            meta={
                "kind": "step",
                "agent": "follower",
                "state": "CONTINUE",
                "status": "CONTINUE",
                "session_step": i + 1,
                "commands": [{"tool_name": "files.write", "parameters": {"path": f"f{i}.txt", "content": "x" * 80}}],
                "results": [{"status": "success", "result": {"bytes_written": 80}}],
                "cost": 0.0001,
            },
        )
        version += 1


def _fast_setup(store: EventStore) -> None:
    """Building 10^4 sessions one fsync each would take minutes; the build is not what is measured."""
    conn = getattr(store, "_conn", None)
    if conn is not None:
        conn.execute("PRAGMA synchronous=OFF")


def _times(client: TestClient, url: str, repeat: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU milliseconds of ``repeat`` requests (CPU: this process's, every thread: what the
    page costs the server whatever else the machine runs; wall: what a user waits, load included)."""
    client.get(url)  # warm: templates compiled, pages cached by the OS
    wall, cpu = [], []
    for _ in range(repeat):
        start, used = time.perf_counter(), time.process_time()
        answer = client.get(url)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - used) * 1000)
        assert answer.status_code == 200, (url, answer.status_code, answer.text[-300:])
    return wall, cpu


def _row(label: str, times: list[float], size: int | None = None, cpu: list[float] | None = None) -> None:
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
    extra = f"  {size / 1024:7.0f} KiB" if size is not None else ""
    if cpu is not None:
        c = statistics.quantiles(cpu, n=10) if len(cpu) >= 2 else [cpu[0]] * 9
        extra += f"   cpu p50 {statistics.median(cpu):7.1f} ms p90 {c[8]:7.1f} ms"
    print(f"  {label:<46} p50 {statistics.median(times):8.1f} ms   p90 {q[8]:8.1f} ms{extra}")


def _bench(label: str, store: EventStore, sessions: int, steps: int, repeat: int) -> None:
    print(f"\n{label}: {sessions} sessions; one session of {steps} steps (load average {_load()})")
    client = TestClient(create_app(store))
    pages: list[tuple[str, str]] = [
        ("sessions page (newest first)", "/sessions"),
        ("sessions page, status=failed", "/sessions?status=failed"),
        ("sessions page, search 'request 4242'", "/sessions?q=request+4242"),
        ("sessions page, sorted by cost", "/sessions?sort=cost"),
        ("sessions page, last page", f"/sessions?page={sessions // 50 + 1}"),
        (f"session page ({steps} steps, newest 200 shown)", "/sessions/long"),
        ("session page with the inspector open", f"/sessions/long?step={store.head('long') // 2}"),
        ("inspector data of a step (a click)", f"/sessions/long/steps/{store.head('long') // 2}"),
        ("inspector data of the newest step", f"/sessions/long/steps/{store.head('long')}"),
        ("state at the middle version", f"/sessions/long/state?at={store.head('long') // 2}"),
        (
            "diff of two versions 100 apart",
            f"/sessions/long/diff?from={store.head('long') // 2}&to={store.head('long') // 2 + 100}",
        ),
        ("history of vars.n", "/sessions/long/history?key=vars.n"),
    ]
    for name, url in pages:
        times, cpu = _times(client, url, repeat)
        _row(name, times, len(client.get(url).content), cpu)
    # What a user meets first: a fresh viewer (nothing kept), the session's page and a click on a
    # step in the middle; then the step after it (↓), which starts from the state the click left.
    middle = store.head("long") // 2
    cold = TestClient(create_app(store))
    for name, url in [
        ("first view of the session page (cold)", "/sessions/long"),
        ("first click on a middle step (cold)", f"/sessions/long/steps/{middle}"),
        ("the next step (↓) after it", f"/sessions/long/steps/{middle + 1}"),
    ]:
        start, used = time.perf_counter(), time.process_time()
        assert cold.get(url).status_code == 200
        _row(name, [(time.perf_counter() - start) * 1000], cpu=[(time.process_time() - used) * 1000])
    print(f"  (load average at the end: {_load()}; {os.cpu_count()} cores)")


def _load() -> str:
    """The 1, 5 and 15 minute load averages: the figures mean little on a machine busy with other work."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--postgres-url", default=os.environ.get("SAUCER_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'ui.db'}")
        _fast_setup(store)
        started = time.perf_counter()
        _fill_sessions(store, args.sessions)
        _fill_steps(store, "long", args.steps)
        print(f"(built the SQLite store in {time.perf_counter() - started:.0f} s)")
        _bench("SQLite", store, args.sessions + 1, args.steps, args.repeat)
        store.close()
    if args.postgres_url:
        schema = f"bench_ui_{uuid.uuid4().hex[:8]}"
        url = f"{args.postgres_url}{'&' if '?' in args.postgres_url else '?'}schema={schema}"
        store = open_store(url)
        try:
            started = time.perf_counter()
            _fill_sessions(store, args.sessions)
            _fill_steps(store, "long", args.steps)
            print(f"(built the PostgreSQL store in {time.perf_counter() - started:.0f} s)")
            _bench("PostgreSQL", store, args.sessions + 1, args.steps, args.repeat)
        finally:
            import psycopg

            store.close()
            with psycopg.connect(args.postgres_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
