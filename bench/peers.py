"""saucer beside its peers in one run: durable steps, and a queue's no-op jobs.

    .venv/bin/python bench/peers.py                     # SQLite columns; PostgreSQL ones with $SAUCER_TEST_POSTGRES_URL
    .venv/bin/python bench/peers.py --steps 300 --repeat 1 --jobs 200   # a quick run

The peers come with the bench extra (``make bench`` installs it): LangGraph
(``SqliteSaver``, ``AsyncPostgresSaver``), DBOS (a workflow of steps, on SQLite
and on PostgreSQL; its queue) and procrastinate (bare, the library saucer's
queue is built on). A system that is not installed shows "not installed".

**Durable steps.** The peers' loop (``i += 1`` each step, state ``{i}``), 1,000
steps, each durable before the next starts: saucer's Context with durability
``step``, LangGraph with ``durability="sync"``, DBOS with one ``@DBOS.step`` per
step (its step outputs are its checkpoints). Beside them the floor: a 128-byte
``write`` + ``fdatasync`` in the same directory, sampled during the same rounds;
for saucer on SQLite also between each block of 50 steps, and the target is
judged on those paired ratios (block by block), which a disk whose latency
drifts during the run does not move; its CPU per step is printed beside.
Each round runs every system once, in a rotated order (so a noisy moment on the
machine does not land on one system); the median of the rounds is shown.
saucer's target (issue 29): a durable SQLite step <= 1.2x fdatasync.

**Queue, no-op jobs** (PostgreSQL). ``--jobs`` jobs that do nothing, put on the
queue first, then one worker of 4 slots in this process takes them all: wall
time per job. Bare procrastinate is the floor of saucer's queue; saucer's own
queue, whose jobs are whole sessions, is measured by ``bench/queue_bench.py``
(its overhead per job is judged against the one-process run there).

The engine's step beside Burr (in memory) is in ``bench/engine.py``; durable
commits from 100 concurrent sessions beside LangGraph in ``bench/concurrency.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
try:
    import saucer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(REPO / "src"))

NOT_INSTALLED = "not installed"


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{dist} {version(dist)}"
    except PackageNotFoundError:
        return f"{dist} {NOT_INSTALLED}"


# ------------------------------------------------------------ durable steps


def fdatasync_floor(directory: Path, n: int = 300) -> float:
    """Median seconds of a 128-byte append + fdatasync in ``directory``."""
    path = directory / "fdatasync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    samples = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, b"x" * 128)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(samples)


def saucer_steps(url: str, steps: int) -> float:
    """Seconds per durable step of saucer's Context (durability ``step``)."""
    from saucer.context import Context

    ctx = Context.open(url, "peers", durability="step")
    with ctx.step():
        ctx.update_vars(set={"i": 0})
    started = time.perf_counter()
    for _ in range(steps):
        with ctx.step():
            ctx.update_vars(set={"i": ctx.get_var("i") + 1})
    elapsed = time.perf_counter() - started
    assert ctx.get_var("i") == steps
    ctx.close()
    return elapsed / steps


def saucer_steps_paired(
    url: str, steps: int, directory: Path, paired: list[float], cpu: list[float], floor_cpu: list[float]
) -> float:
    """:func:`saucer_steps`, with the floor sampled between blocks of :data:`BLOCK` steps: each block's
    time per step over the median fdatasync sampled right after it goes into ``paired``, and the
    process's CPU per step (``getrusage``) into ``cpu`` (and the floor's own, a write and an
    fdatasync being CPU of the kernel's too, into ``floor_cpu``). On a shared machine the disk's latency
    drifts by 10x within minutes; a ratio of figures taken seconds apart does not."""
    import resource

    from saucer.context import Context

    ctx = Context.open(url, "peers", durability="step")
    with ctx.step():
        ctx.update_vars(set={"i": 0})
    total = 0.0
    done = 0
    while done < steps:
        n = min(BLOCK, steps - done)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        for _ in range(n):
            with ctx.step():
                ctx.update_vars(set={"i": ctx.get_var("i") + 1})
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append((after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime) / n)
        paired.append(elapsed / n / fdatasync_floor(directory, BLOCK))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        floor_cpu.append((usage.ru_utime + usage.ru_stime - after.ru_utime - after.ru_stime) / BLOCK)
        total += elapsed
        done += n
    assert ctx.get_var("i") == steps
    ctx.close()
    return total / steps


#: Steps between two samplings of the floor in :func:`saucer_steps_paired`.
BLOCK = 50


def _langgraph_graph(steps: int, checkpointer: Any) -> Any:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        i: int

    graph = StateGraph(State)
    graph.add_node("step", lambda s: {"i": s["i"] + 1})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda s: "step" if s["i"] < steps else END)
    return graph.compile(checkpointer=checkpointer)


def langgraph_sqlite_steps(path: Path, steps: int) -> float:
    """Seconds per step of LangGraph's SqliteSaver, durability ``sync``."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    app = _langgraph_graph(steps, SqliteSaver(conn))
    config = {"configurable": {"thread_id": "t1"}, "recursion_limit": steps + 10}
    started = time.perf_counter()
    out = app.invoke({"i": 0}, config, durability="sync")
    elapsed = time.perf_counter() - started
    conn.close()
    assert out["i"] == steps
    return elapsed / steps


def langgraph_postgres_steps(base: str, schema: str, steps: int) -> float:
    """Seconds per step of LangGraph's AsyncPostgresSaver, durability ``sync``, in a schema of its own."""
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    conninfo = psycopg.conninfo.make_conninfo(base, options=f"-c search_path={schema}")

    async def run() -> float:
        async with AsyncPostgresSaver.from_conn_string(conninfo) as saver:
            await saver.setup()
            app = _langgraph_graph(steps, saver)
            config = {"configurable": {"thread_id": "t1"}, "recursion_limit": steps + 10}
            started = time.perf_counter()
            out = await app.ainvoke({"i": 0}, config, durability="sync")
            elapsed = time.perf_counter() - started
            assert out["i"] == steps
            return elapsed / steps

    return asyncio.run(run())


_DBOS_STEPS = """
import sys, time, logging
from dbos import DBOS
url, steps = sys.argv[1], int(sys.argv[2])
DBOS(config={"name": "saucer-bench", "system_database_url": url, "run_admin_server": False, "log_level": "WARNING"})

@DBOS.step()
def step(i: int) -> int:
    return i + 1

@DBOS.workflow()
def loop(n: int) -> int:
    i = 0
    for _ in range(n):
        i = step(i)
    return i

DBOS.launch()
started = time.perf_counter()
assert loop(steps) == steps
print(json.dumps({"seconds_per_step": (time.perf_counter() - started) / steps}))
DBOS.destroy()
"""


def _dbos(script: str, url: str, n: int, field: str, timeout: float) -> float:
    """Run a DBOS script in a process of its own (DBOS is one per process); the figure it prints as ``field``."""
    proc = subprocess.run(
        [sys.executable, "-c", "import json\n" + script, url, str(n)], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS run failed: {proc.stderr.strip()[-500:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])[field])


def dbos_steps(url: str, steps: int) -> float:
    """Seconds per step of a DBOS workflow of ``steps`` steps."""
    return _dbos(_DBOS_STEPS, url, steps, "seconds_per_step", timeout=600)


# ------------------------------------------------------------------ queues


def procrastinate_noop(base: str, schema: str, jobs: int) -> float:
    """Seconds per no-op job through bare procrastinate: defer all, then one worker of 4 slots takes them."""
    import procrastinate
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=base, kwargs={"options": f"-c search_path={schema}"})
    )

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async def run() -> float:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await noop.batch_defer_async(*({} for _ in range(jobs)))
            started = time.perf_counter()
            await app.run_worker_async(concurrency=4, wait=False, install_signal_handlers=False)
            elapsed = time.perf_counter() - started
            async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
                cur = await conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
                row = await cur.fetchone()
            assert row is not None and row[0] == jobs, f"{row} of {jobs} jobs succeeded"
            return elapsed / jobs

    return asyncio.run(run())


_DBOS_QUEUE = """
import sys, time
from dbos import DBOS
url, jobs = sys.argv[1], int(sys.argv[2])
DBOS(config={"name": "saucer-bench", "system_database_url": url, "run_admin_server": False, "log_level": "WARNING"})
@DBOS.workflow()
def noop() -> None:
    return None

DBOS.launch()
queue = DBOS.register_queue("bench", worker_concurrency=4, polling_interval_sec=0.01)
started = time.perf_counter()
handles = [queue.enqueue(noop) for _ in range(jobs)]
for handle in handles:
    handle.get_result()
print(json.dumps({"seconds_per_job": (time.perf_counter() - started) / jobs}))
DBOS.destroy()
"""


def dbos_queue_noop(url: str, jobs: int) -> float:
    """Seconds per no-op workflow through a DBOS queue of worker concurrency 4 (enqueue included)."""
    return _dbos(_DBOS_QUEUE, url, jobs, "seconds_per_job", timeout=900)


# ---------------------------------------------------------------- plumbing


class Postgres:
    """Fresh schemas and databases on one server, all dropped at the end."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.schemas: list[str] = []
        self.databases: list[str] = []

    def schema(self) -> str:
        name = "peers_" + uuid.uuid4().hex[:10]
        self.schemas.append(name)
        return name

    def saucer_url(self) -> str:
        name = self.schema()
        return f"{self.base}{'&' if '?' in self.base else '?'}schema={name}"

    def database_url(self) -> str:
        """A database DBOS creates (its system database is a whole database)."""
        import psycopg

        name = "peers_dbos_" + uuid.uuid4().hex[:10]
        self.databases.append(name)
        info = psycopg.conninfo.conninfo_to_dict(self.base)
        info["dbname"] = name
        user = info.get("user", "postgres")
        host = info.get("host", "127.0.0.1")
        port = info.get("port", 5432)
        return f"postgresql://{user}@{host}:{port}/{name}"

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            for name in self.schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            for name in self.databases:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _rounds(systems: list[tuple[str, Callable[[int], float] | None]], repeat: int) -> dict[str, list[float] | str]:
    """Run every available system once per round, order rotated each round; {name: [seconds...] or reason}."""
    out: dict[str, list[float] | str] = {}
    live = []
    for name, fn in systems:
        if fn is None:
            out[name] = NOT_INSTALLED
        else:
            out[name] = []
            live.append((name, fn))
    for r in range(repeat):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for name, fn in order:
            samples = out[name]
            if isinstance(samples, str):
                continue
            try:
                samples.append(fn(r))
            except Exception as exc:  # a peer that fails is reported, not fatal
                out[name] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
            print(".", end="", flush=True)
    print()
    return out


def _cell(value: list[float] | str, scale: float = 1e3) -> str:
    return value if isinstance(value, str) else f"{statistics.median(value) * scale:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="durable steps per run (default 1000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the median is shown (default 3)")
    parser.add_argument("--jobs", type=int, default=500, help="no-op jobs per queue run (default 500)")
    parser.add_argument("--dir", type=Path, default=REPO / ".saucer" / "bench", help="where the files go (a real disk)")
    parser.add_argument("--postgres-url", default=os.environ.get("SAUCER_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="peers-", dir=args.dir))
    pg = Postgres(args.postgres_url) if args.postgres_url else None
    has_langgraph = _installed("langgraph.checkpoint.sqlite") and _installed("langgraph.checkpoint.postgres")
    has_dbos = _installed("dbos")
    started = time.perf_counter()
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
        f"python {platform.python_version()}, SQLite {sqlite3.sqlite_version}; files in {work}"
    )
    print(
        "versions: "
        + ", ".join(
            _version(d) for d in ("saucer", "langgraph", "langgraph-checkpoint-sqlite", "dbos", "procrastinate")
        )
    )
    try:
        steps = args.steps
        floor: list[float] = []
        paired: list[float] = []  # saucer SQLite: each block's time per step over the floor sampled after it
        cpu: list[float] = []  # its CPU seconds per step, block by block
        floor_cpu: list[float] = []  # the floor's, per write + fdatasync

        def fresh(name: str) -> Path:
            return work / f"{name}-{uuid.uuid4().hex[:6]}.db"

        def with_floor(fn: Callable[[int], float]) -> Callable[[int], float]:
            def run(r: int) -> float:
                floor.append(fdatasync_floor(work))
                return fn(r)

            return run

        systems: list[tuple[str, Callable[[int], float] | None]] = [
            (
                "saucer SQLite",
                with_floor(
                    lambda r: saucer_steps_paired(f"sqlite:///{fresh('saucer')}", steps, work, paired, cpu, floor_cpu)
                ),
            ),
            (
                "LangGraph SqliteSaver (sync)",
                (lambda r: langgraph_sqlite_steps(fresh("lg"), steps)) if has_langgraph else None,
            ),
            ("DBOS SQLite", (lambda r: dbos_steps(f"sqlite:///{fresh('dbos')}", steps)) if has_dbos else None),
        ]
        if pg is not None:
            systems += [
                ("saucer PostgreSQL", lambda r: saucer_steps(pg.saucer_url(), steps)),
                (
                    "LangGraph AsyncPostgresSaver (sync)",
                    (lambda r: langgraph_postgres_steps(pg.base, pg.schema(), steps)) if has_langgraph else None,
                ),
                ("DBOS PostgreSQL", (lambda r: dbos_steps(pg.database_url(), steps)) if has_dbos else None),
            ]
        print(f"\ndurable steps: {steps} steps of state {{i}}, {args.repeat} rounds ", end="", flush=True)
        results = _rounds(systems, args.repeat)
        floor_s = statistics.median(floor) if floor else float("nan")
        print(f"\n{'durable step, ms per step (median)':44} {'ms':>9} {'x fdatasync':>12} {'x saucer':>9}  target")
        print(f"{'write 128 B + fdatasync (the floor)':44} {floor_s * 1e3:9.3f} {1.0:12.2f} {'':>9}  reference")
        for name, value in results.items():
            backend = "PostgreSQL" if "Postgre" in name else "SQLite"
            ours = results[f"saucer {backend}"]
            ratio = ""
            times = ""
            if not isinstance(value, str):
                med = statistics.median(value)
                ratio = f"{med / floor_s:12.2f}" if backend == "SQLite" else f"{'':>12}"
                if not isinstance(ours, str):
                    times = f"{med / statistics.median(ours):9.2f}"
            target = "<= 1.2x fdatasync" if name == "saucer SQLite" else ""
            print(f"{name:44} {_cell(value):>9} {ratio:>12} {times:>9}  {target}")
        if paired:
            deciles = statistics.quantiles(paired, n=10) if len(paired) > 1 else paired * 9
            verdict = "PASS" if statistics.median(paired) <= 1.2 else "MISS"
            print(
                f"saucer SQLite paired with the floor (blocks of {BLOCK} steps, fdatasync sampled after each): "
                f"median {statistics.median(paired):.2f}x (10th-90th percentile {deciles[0]:.2f}-{deciles[-1]:.2f}), "
                f"CPU {statistics.median(cpu) * 1e3:.3f} ms/step (the floor's own: "
                f"{statistics.median(floor_cpu) * 1e3:.3f} ms); target <= 1.2x fdatasync: {verdict}"
            )

        if pg is not None:
            jobs = args.jobs
            queues: list[tuple[str, Callable[[int], float] | None]] = [
                ("procrastinate (bare), 1 worker x 4", lambda r: procrastinate_noop(pg.base, pg.schema(), jobs)),
                (
                    "DBOS queue, worker concurrency 4",
                    (lambda r: dbos_queue_noop(pg.database_url(), jobs)) if has_dbos else None,
                ),
            ]
            print(f"\nqueue: {jobs} no-op jobs on PostgreSQL, {args.repeat} rounds ", end="", flush=True)
            qres = _rounds(queues, args.repeat)
            print(f"\n{'queue, no-op job':44} {'ms/job':>9} {'jobs/s':>9}")
            for name, value in qres.items():
                rate = "" if isinstance(value, str) else f"{1 / statistics.median(value):9.0f}"
                print(f"{name:44} {_cell(value):>9} {rate:>9}")
            print(
                "saucer's queue (jobs are sessions): bench/queue_bench.py; target: <= 2.5 ms a job over the same sessions without the queue"
            )
        else:
            print("\nqueue and PostgreSQL columns skipped: set SAUCER_TEST_POSTGRES_URL or pass --postgres-url")
    finally:
        if pg is not None:
            pg.drop_all()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
