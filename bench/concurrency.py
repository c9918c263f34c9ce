"""Durable commits per second with 1, 10 and 100 sessions committing at once in one process.

Each session has its own :class:`saucer.context.Context`; a step is
``ctx.incr("n")`` + ``ctx.append("log", i)`` + a commit, which returns only once
the event is durable (SQLite: WAL with ``synchronous=FULL``; PostgreSQL: COMMIT
acknowledged under the server's ``synchronous_commit``, which the report
prints). Concurrent commits share transactions and fsyncs (group commit,
``saucer.store._group``). Default Context settings (snapshots included).
Sessions run two ways (``--modes``):

- ``tasks``: asyncio tasks of one event loop, committing with ``await
  ctx.acommit()``, which is how saucer's engine runs the sessions of a pool;
- ``threads``: a thread per session, committing with ``ctx.commit()``.

The targets (100 sessions: 20,000 durable commits/s on SQLite, 25,000 on
PostgreSQL, issue 29) are checked on ``tasks``. Beside each figure, the CPU this
process spent per commit (``getrusage``: the sessions' loop and the group-commit
writer) and, when the PostgreSQL server runs on this machine, its backends' CPU
per commit (``/proc``): on a shared machine they vary less than commits/s.

Beside them, LangGraph's ``PostgresSaver`` running a one-node loop graph with
``durability="sync"``: one durable checkpoint per step, one thread per
``thread_id``, a connection pool as large as the thread count (at most 90).
LangGraph is not a saucer dependency; the script imports it when it can, or
runs itself under ``--langgraph-python`` (a venv with ``langgraph``,
``langgraph-checkpoint-postgres``, ``psycopg[binary]`` and ``psycopg-pool``).

    .venv/bin/python bench/concurrency.py \\
        --postgres-url postgresql://postgres@127.0.0.1:5432/test \\
        --langgraph-python /tmp/peers2/bin/python

Every store gets a fresh SQLite file or PostgreSQL schema, dropped afterwards.
Figures are the median of ``--repeat`` runs of ``--seconds`` each, after a
short warm-up; latency percentiles are per commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 0.5


@dataclass
class Result:
    system: str
    sessions: int
    commits_per_s: float
    p50_ms: float
    p99_ms: float
    runs: list[float]
    note: str = ""


def _drive(n: int, seconds: float, make_step: Callable[[int], Callable[[], list[float]]]) -> tuple[float, float, float]:
    """Run ``n`` threads, each calling its step function in a loop; return (rate, p50 ms, p99 ms).

    A step function performs one or more durable commits and returns the
    ``perf_counter()`` at which each became durable; those inside the measured
    window count.
    """
    steps = [make_step(i) for i in range(n)]
    begin = threading.Barrier(n + 1)
    window: list[float] = [0.0, 0.0]
    counts = [0] * n
    latencies: list[list[float]] = [[] for _ in range(n)]
    stop = threading.Event()
    failures: list[BaseException] = []

    def worker(i: int) -> None:
        step, lat = steps[i], latencies[i]
        begin.wait()
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                done = step()
                each = (time.perf_counter() - t0) / max(1, len(done))
                for t in done:
                    if window[0] <= t <= window[1]:
                        counts[i] += 1
                        lat.append(each)
        except BaseException as exc:  # reported after the run
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    now = time.perf_counter()
    window[0], window[1] = now + WARMUP, now + WARMUP + seconds
    begin.wait()
    time.sleep(WARMUP + seconds)
    stop.set()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of {n} sessions failed") from failures[0]
    return _figures(counts, latencies, seconds)


def _figures(counts: list[int], latencies: list[list[float]], seconds: float) -> tuple[float, float, float]:
    """(commits per second, p50 ms, p99 ms) of a run."""
    all_lat = sorted(x for lat in latencies for x in lat)
    if not all_lat:
        return 0.0, 0.0, 0.0
    p50 = all_lat[len(all_lat) // 2] * 1000
    p99 = all_lat[min(len(all_lat) - 1, int(len(all_lat) * 0.99))] * 1000
    return sum(counts) / seconds, p50, p99


# --------------------------------------------------------------------- saucer


def _drive_tasks(contexts: list, seconds: float) -> tuple[float, float, float]:
    """Run one asyncio task per Context on one event loop, each committing with ``acommit()`` in a loop."""
    import asyncio

    async def run() -> tuple[float, float, float]:
        window = [0.0, 0.0]
        counts = [0] * len(contexts)
        latencies: list[list[float]] = [[] for _ in contexts]
        stop = False

        async def session(i: int) -> None:
            ctx, lat = contexts[i], latencies[i]
            while not stop:
                t0 = time.perf_counter()
                k = ctx.incr("n")
                ctx.append("log", k)
                await ctx.acommit()
                t1 = time.perf_counter()
                if window[0] <= t1 <= window[1]:
                    counts[i] += 1
                    lat.append(t1 - t0)

        now = time.perf_counter()
        window[0], window[1] = now + WARMUP, now + WARMUP + seconds
        tasks = [asyncio.create_task(session(i)) for i in range(len(contexts))]
        await asyncio.sleep(WARMUP + seconds)
        stop = True
        await asyncio.gather(*tasks)
        return _figures(counts, latencies, seconds)

    return asyncio.run(run())


def _saucer_run(url: str, n: int, seconds: float, mode: str) -> tuple[float, float, float, str]:
    """``mode`` "tasks": sessions are asyncio tasks of one loop (how the engine runs them); "threads": a thread each."""
    sys.path.insert(0, str(ROOT / "src"))
    from saucer.context import Context
    from saucer.store import open_store

    store = open_store(url)
    try:
        contexts = [Context.open(store, f"bench-{n}-{i}", author="bench") for i in range(n)]
        versions = sum(ctx.version for ctx in contexts)
        server = _ServerCpu(store)
        cpu = _process_cpu()
        if mode == "tasks":
            rate, p50, p99 = _drive_tasks(contexts, seconds)
        else:

            def make_step(i: int) -> Callable[[], list[float]]:
                ctx = contexts[i]

                def step() -> list[float]:
                    k = ctx.incr("n")
                    ctx.append("log", k)
                    ctx.commit()
                    return [time.perf_counter()]

                return step

            rate, p50, p99 = _drive(n, seconds, make_step)
        cpu = _process_cpu() - cpu
        commits = max(1, sum(ctx.version for ctx in contexts) - versions)  # the warm-up's too, as the CPU
        server_s = server.seconds()
        committer = store._group_committer()
        note = f"avg batch {committer.entries / committer.batches:.1f}" if committer.batches else ""
        note += f"; CPU {cpu / commits * 1e6:.1f} us/commit"
        if server_s is not None:
            note += f" + server {server_s / commits * 1e6:.1f}"
        for ctx in contexts:
            ctx.close()
        return rate, p50, p99, note
    finally:
        store.close()


def _process_cpu() -> float:
    """This process's CPU seconds (all its threads: the sessions' loop and the group-commit writer)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _ServerCpu:
    """CPU seconds of the PostgreSQL backends serving a store (and of the WAL writer), read from
    ``/proc`` when the server runs on this machine and may be read; None otherwise (or SQLite)."""

    def __init__(self, store: object) -> None:
        self._store = store
        self._start = self._read(self._pids(), {})

    def _pids(self) -> set[int]:
        db = getattr(self._store, "_db", None)
        if db is None:
            return set()
        pids: set[int] = set()
        for pool in (db._pool, db._cache_pool):  # their idle connections: all of them between runs
            if pool is not None:
                pids.update(conn.info.backend_pid for conn in list(pool._pool))
        with db.conn() as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").fetchall()
        return pids | {row[0] for row in rows}

    @staticmethod
    def _read(pids: set[int], into: dict[int, float]) -> dict[int, float] | None:
        tick = os.sysconf("SC_CLK_TCK")
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return None  # a remote server, or not ours to read
            into[pid] = (int(fields[11]) + int(fields[12])) / tick
        return into

    def seconds(self) -> float | None:
        if self._start is None or not self._start:
            return None
        end = self._read(self._pids(), {})
        if end is None:
            return None
        return sum(t - self._start.get(pid, 0.0) for pid, t in end.items())


def bench_sqlite(n: int, seconds: float, mode: str) -> tuple[float, float, float, str]:
    with tempfile.TemporaryDirectory(prefix="saucer-bench-") as tmp:
        return _saucer_run(f"sqlite:///{tmp}/bench.db", n, seconds, mode)


def _pg_schema_url(base: str, schema: str) -> str:
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def _drop_schema(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base.split("?")[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def bench_postgres(base: str, n: int, seconds: float, mode: str) -> tuple[float, float, float, str]:
    schema = f"saucer_bench_{os.getpid()}_{n}"
    _drop_schema(base, schema)
    try:
        return _saucer_run(_pg_schema_url(base, schema), n, seconds, mode)
    finally:
        _drop_schema(base, schema)


# ------------------------------------------------------------------ langgraph


def bench_langgraph(base: str, n: int, seconds: float) -> tuple[float, float, float, str]:
    from typing import TypedDict

    import psycopg
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    schema = f"lg_bench_{os.getpid()}_{n}"
    plain = base.split("?")[0]
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    steps_per_invoke = 10
    stamps: dict[str, list[float]] = {}

    class S(TypedDict):
        n: int

    def node(state: S, config: RunnableConfig) -> dict[str, int]:
        # Each step runs after the previous step's checkpoint is durable (sync).
        stamps[config["configurable"]["thread_id"]].append(time.perf_counter())
        return {"n": state["n"] + 1}

    builder = StateGraph(S)
    builder.add_node("step", node)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] % steps_per_invoke else END)
    pool = ConnectionPool(
        plain,
        min_size=min(n, 90),
        max_size=min(n, 90),
        kwargs={
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
            "options": f"-csearch_path={schema}",
        },
        open=True,
    )
    try:
        pool.wait()
        saver = PostgresSaver(pool)
        saver.setup()
        graph = builder.compile(checkpointer=saver)

        def make_step(i: int) -> Callable[[], list[float]]:
            config = {"configurable": {"thread_id": f"t{i}"}, "recursion_limit": steps_per_invoke + 10}
            state = {"n": 0}

            def step() -> list[float]:
                times = stamps[f"t{i}"] = []
                out = graph.invoke({"n": state["n"]}, config, durability="sync")
                state["n"] = out["n"]
                # A step's checkpoint is durable when the next step starts, the
                # last one when invoke() returns.
                return times[1:] + [time.perf_counter()]

            return step

        rate, p50, p99 = _drive(n, seconds, make_step)
        return rate, p50, p99, f"{steps_per_invoke}-step invokes"
    finally:
        pool.close()
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _langgraph_importable() -> bool:
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
        import langgraph.graph  # noqa: F401
    except ImportError:
        return False
    return True


def _langgraph_elsewhere(python: str, base: str, sizes: list[int], seconds: float, repeat: int) -> list[Result]:
    cmd = [
        python,
        __file__,
        "--only",
        "langgraph",
        "--json",
        "-",
        "--postgres-url",
        base,
        "--sessions",
        ",".join(map(str, sizes)),
        "--seconds",
        str(seconds),
        "--repeat",
        str(repeat),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} could not run the LangGraph leg:\n{proc.stderr[-2000:]}")
    return [Result(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


# ----------------------------------------------------------------------- main


def _measure(
    system: str, fn: Callable[[int, float], tuple[float, float, float, str]], n: int, seconds: float, repeat: int
) -> Result:
    runs = [fn(n, seconds) for _ in range(repeat)]
    best = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    return Result(system, n, best[0], best[1], best[2], [round(r[0]) for r in runs], best[3])


def _settings(base: str | None) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load} at the end"]
    if base:
        try:
            import psycopg

            with psycopg.connect(base.split("?")[0], autocommit=True) as conn:
                v = conn.execute("SHOW server_version").fetchone()[0]
                sc = conn.execute("SHOW synchronous_commit").fetchone()[0]
                fs = conn.execute("SHOW fsync").fetchone()[0]
            lines.append(f"PostgreSQL {v}: synchronous_commit={sc}, fsync={fs}")
        except Exception as exc:  # the report still shows what ran
            lines.append(f"PostgreSQL: {exc}")
    lines.append("SQLite: WAL, synchronous=FULL")
    return "; ".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", default="1,10,100", help="comma-separated session counts")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell (the median is reported)")
    ap.add_argument(
        "--postgres-url",
        default=os.environ.get("SAUCER_TEST_POSTGRES_URL"),
        help="a PostgreSQL server to use (default: $SAUCER_TEST_POSTGRES_URL)",
    )
    ap.add_argument("--only", default="sqlite,postgres,langgraph", help="which systems to run")
    ap.add_argument(
        "--modes",
        default="tasks,threads",
        help="how saucer's sessions run: tasks (asyncio tasks of one loop committing with acommit, "
        "as the engine runs them) and/or threads (a thread each, commit)",
    )
    ap.add_argument("--langgraph-python", help="a Python with LangGraph, if this one has none")
    ap.add_argument("--json", help="also write the results as JSON to this file ('-': stdout only)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sessions.split(",")]
    only = set(args.only.split(","))
    results: list[Result] = []
    skipped: list[str] = []
    quiet = args.json == "-"

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    modes = [m for m in args.modes.split(",") if m]
    if "sqlite" in only:
        for mode in modes:
            for n in sizes:
                results.append(
                    _measure(
                        f"saucer SQLite, {mode}",
                        lambda k, s, mode=mode: bench_sqlite(k, s, mode),
                        n,
                        args.seconds,
                        args.repeat,
                    )
                )
                say(f"  {results[-1]}")
    if {"postgres", "langgraph"} & only and not args.postgres_url:
        skipped.append("PostgreSQL and LangGraph: no --postgres-url (or SAUCER_TEST_POSTGRES_URL)")
    elif "postgres" in only:
        for mode in modes:
            for n in sizes:
                results.append(
                    _measure(
                        f"saucer PostgreSQL, {mode}",
                        lambda k, s, mode=mode: bench_postgres(args.postgres_url, k, s, mode),
                        n,
                        args.seconds,
                        args.repeat,
                    )
                )
                say(f"  {results[-1]}")
    if "langgraph" in only and args.postgres_url:
        if _langgraph_importable():
            for n in sizes:
                results.append(
                    _measure(
                        "LangGraph PostgresSaver (sync)",
                        lambda k, s: bench_langgraph(args.postgres_url, k, s),
                        n,
                        args.seconds,
                        args.repeat,
                    )
                )
                say(f"  {results[-1]}")
        elif args.langgraph_python:
            results += _langgraph_elsewhere(args.langgraph_python, args.postgres_url, sizes, args.seconds, args.repeat)
        else:
            skipped.append("LangGraph: not importable here; pass --langgraph-python")

    if args.json == "-":
        print(json.dumps([asdict(r) for r in results]))
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(_settings(args.postgres_url))
    print(f"median of {args.repeat} x {args.seconds:g} s per cell; one commit = one durable step\n")
    header = f"{'system':32} {'sessions':>8} {'commits/s':>10} {'p50 ms':>8} {'p99 ms':>8}  runs (commits/s), note"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.system:32} {r.sessions:>8} {r.commits_per_s:>10,.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f}  "
            f"{', '.join(f'{x:,}' for x in r.runs)}{'; ' + r.note if r.note else ''}"
        )
    for s in skipped:
        print(f"skipped: {s}")
    targets = {"saucer SQLite, tasks": 20_000, "saucer PostgreSQL, tasks": 25_000}
    for r in results:
        if r.system in targets and r.sessions == 100:
            verdict = "PASS" if r.commits_per_s >= targets[r.system] else "MISS"
            print(f"target: {r.system}, 100 sessions >= {targets[r.system]:,} durable commits/s: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
