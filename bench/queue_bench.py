"""Queue benchmark: 1,000 follower sessions through 1, 2 and 4 worker processes, beside the same batch in one process.

    .venv/bin/python bench/queue_bench.py                       # needs SAUCER_TEST_POSTGRES_URL (or --postgres-url)
    .venv/bin/python bench/queue_bench.py --sessions 200        # a smaller run

Every session is the same follower plan (3 command steps, an in-process tool
that answers at once, as in bench/engine.py's pool scenarios), on one
PostgreSQL store, a fresh schema per scenario (dropped afterwards):

``one process``   the 1,000 sessions through one ``SessionPool`` (concurrency 4): no queue.
``N workers``     the 1,000 jobs put on the queue (``QueueClient.enqueue``, one
                  claim + defer each), then N ``run_worker`` processes of 4 slots
                  each take them. Workers are started and registered first; the
                  wall time runs from the first enqueue to the last job done.

Printed: sessions per second, the CPU per job (the one process's, or the workers' together from
the queueing on), the longest event-loop stall a 1 ms ticker saw in
a worker, the database's commits per session (``pg_stat_database.xact_commit``
over each run: load-independent, exact when the bench has its database to
itself, e.g. ``--postgres-url postgresql://postgres@127.0.0.1:5432/bench``), and
the queue's overhead per job: the
1-worker run's wall time minus the one-process run's, over the sessions
(the same concurrency, so what is left is what the queue adds: the enqueue,
the fetch, the job's status writes and the worker's own session lookups).

``SAUCER_BENCH_PROFILE=/tmp/prof`` writes each worker's cProfile (CPU time of its loop's thread) to
``/tmp/prof-<pid>.prof``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def plan_of(steps: int) -> dict[str, Any]:
    """A follower plan of ``steps`` command steps."""
    return {
        "task": "bench",
        "steps": [
            {
                "subtask": f"step {i}",
                "commands": [{"tool_name": "files.write", "parameters": {"path": f"f{i}", "content": "x"}}],
            }
            for i in range(steps)
        ],
    }


PLAN = plan_of(3)


class _Tool:
    """An in-process tool answering at once."""

    async def execute_commands(self, commands: list[Any], timeout: float | None = None) -> list[Any]:
        from saucer.dispatch.messages import Result, ResultStatus

        return [Result(status=ResultStatus.SUCCESS, result="ok", call_id=c.call_id) for c in commands]

    def list_tools(self) -> list[dict[str, Any]]:
        return [{"name": "files.write"}]


def _settings(url: str, logs: Path) -> Any:
    from saucer.config import load_settings

    return load_settings(
        overrides={
            "store.url": url,
            "logs.root": str(logs),
            "system.save_experience": "always_not",
            "system.log_to_markdown": False,
            "system.save_ui_tree": False,
            "queue.heartbeat": 2.0,
        }
    )


def _schema_url(base: str) -> tuple[str, str]:
    schema = "bq_" + uuid.uuid4().hex[:10]
    return f"{base}{'&' if '?' in base else '?'}schema={schema}", schema


def _commits(base: str) -> int:
    """The database's committed transactions so far (``pg_stat_database.xact_commit``).

    Each backend reports its counts when its connection closes (or about once a second while it
    runs): read after a scenario's processes and pools are closed. Other clients of the same
    database count too: give the bench a database of its own for exact figures."""
    import psycopg

    time.sleep(0.5)
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def _drop(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        for name in (schema, f"{schema}_queue"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def one_process(url: str, logs: Path, sessions: int, plan: dict[str, Any]) -> float:
    from saucer.engine import Session, SessionPool
    from saucer.store import open_store

    settings = _settings(url, logs)
    store = open_store(url)
    tool = _Tool()
    items = [
        Session("bench", mode="follower", settings=settings, store=store, plan=plan, dispatcher=tool)
        for _ in range(sessions)
    ]
    pg = _backends(_BASE[0])
    t, cpu = time.perf_counter(), time.process_time()
    results = asyncio.run(SessionPool(items, max_concurrency=4).run_all())
    wall = time.perf_counter() - t
    _CPU[0] = time.process_time() - cpu
    _PG_CPU[0] = _pg_cpu_since(_BASE[0], pg)
    store.close()
    assert all(r.ok for r in results)
    return wall


def _run_delay(fd: int) -> float:
    """Seconds the thread of ``fd`` (its ``/proc/.../schedstat``) has waited, runnable, for a core."""
    return int(os.pread(fd, 128, 0).split()[1]) / 1e9


async def _stall_ticker(path: Path, seen: list[float], period: float = 0.001) -> None:
    """Wake every ``period`` s; keep in ``seen`` and ``path`` the longest lateness seen (the loop's longest
    stall) and the longest lateness net of the time the loop's thread waited for a core meanwhile (the
    kernel's run-queue delay, from its ``schedstat``): what the process itself held the loop for (its
    callbacks, a blocking call, a garbage collection, another of its threads holding the GIL), with the
    machine's other load left out. Setting ``seen`` to zeros starts again (the jobs' start); its third item
    set stops it (the jobs' end)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    loop = asyncio.get_running_loop()
    fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    try:
        while True:
            due, waited = loop.time() + period, _run_delay(fd)
            await asyncio.sleep(period)
            late = loop.time() - due
            if late > seen[1] and not seen[2]:
                mine = late - (_run_delay(fd) - waited)
                if late > seen[0] or mine > seen[1]:
                    seen[:2] = [max(seen[0], late), max(seen[1], mine)]
                    path.write_text(f"{seen[0]:.6f} {seen[1]:.6f}")
    finally:
        os.close(fd)


def _gc_pauses(path: Path) -> Callable[..., None]:
    """Keep in ``path`` this process's garbage collections from now: their count, the longest, and its
    generation; returns what starts the count again (the jobs' start) or, given True, stops it (their end)."""
    started = [0.0]
    stats = [0, 0.0, 0]
    stopped = [False]

    def callback(phase: str, info: dict[str, int]) -> None:
        if stopped[0]:
            return
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took = time.perf_counter() - started[0]
        stats[0] += 1
        if took > stats[1]:
            stats[1], stats[2] = took, info["generation"]
        if stats[0] % 50 == 0 or took == stats[1]:
            with contextlib.suppress(OSError):  # (before the ticker made the folder, or after the bench removed it)
                path.write_text(f"{stats[0]} {stats[1]:.6f} {stats[2]}")

    def reset(stop: bool = False) -> None:
        if stop:
            stopped[0] = True
        else:
            stats[:] = [0, 0.0, 0]

    gc.callbacks.append(callback)
    return reset


def _thread_cpu() -> dict[str, float]:
    """The CPU seconds of each of this process's threads so far, by kind: the loop's (``loop``), the default
    executor's (``asyncio``), psycopg's pools' workers, the store's writer... (a number in a name dropped)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    loop_thread = threading.get_native_id()
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        name = "loop" if tid == loop_thread else names.get(tid, "other")
        kind = "".join(c for c in name.split(" ")[0] if not c.isdigit()).strip("-_ ") or name
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _worker_main(url: str, logs: str) -> None:
    from saucer.queue import run_worker

    async def main() -> None:
        seen = [0.0, 0.0, 0.0]
        ticker = asyncio.create_task(_stall_ticker(Path(logs) / f"stall-{os.getpid()}", seen))
        gc_reset = _gc_pauses(Path(logs) / f"gc-{os.getpid()}")
        # The CPU, stalls and garbage collections of this process from the bench's SIGUSR1 (all workers
        # registered, the jobs about to be queued) to its SIGUSR2 (all jobs done): start-up and shutdown left out.
        mark = [time.process_time(), 0.0]

        threads: list[dict[str, float]] = [{}]

        def jobs_start() -> None:
            threads[0] = _thread_cpu()
            mark[0] = time.process_time()
            seen[:] = [0.0, 0.0, 0.0]
            gc_reset()

        def jobs_done() -> None:
            mark[1] = time.process_time()
            now = _thread_cpu()
            spent = {kind: cpu - threads[0].get(kind, 0.0) for kind, cpu in now.items()}
            (Path(logs) / f"threads-{os.getpid()}").write_text(
                "\n".join(f"{kind} {cpu:.6f}" for kind, cpu in spent.items())
            )
            seen[2] = 1.0
            gc_reset(stop=True)

        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, jobs_start)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, jobs_done)
        try:
            await run_worker(_settings(url, Path(logs)), concurrency=4, dispatcher_factory=lambda session: _Tool())
        finally:
            ticker.cancel()
            (Path(logs) / f"cpu-{os.getpid()}").write_text(f"{(mark[1] or time.process_time()) - mark[0]:.6f}")

    profile = os.environ.get("SAUCER_BENCH_PROFILE")
    if not profile:
        asyncio.run(main())
        return
    import cProfile

    with cProfile.Profile(time.thread_time) as prof:
        asyncio.run(main())
    prof.dump_stats(f"{profile}-{os.getpid()}.prof")


#: The CPU seconds of the last run: the one process's, or the workers' together (from their jobs' queueing).
_CPU = [0.0]


def _longest_stall(logs: Path) -> tuple[float, float] | None:
    """The longest event-loop stall any worker of a run recorded (seconds), and the longest net of waiting
    for a core (see :func:`_stall_ticker`), if any recorded one."""
    stalls = [tuple(map(float, p.read_text().split())) for p in logs.glob("stall-*") if p.read_text()]
    return (max(s[0] for s in stalls), max(s[1] for s in stalls)) if stalls else None


def _longest_gc(logs: Path) -> str:
    """The longest garbage collection any worker of a run recorded (ms, the generation), and how many there were."""
    pauses = [p.read_text().split() for p in logs.glob("gc-*") if p.read_text()]
    if not pauses:
        return ""
    count, took, gen = max(pauses, key=lambda p: float(p[1]))
    return f"{float(took) * 1000:.1f} g{gen} of {sum(int(p[0]) for p in pauses)}"


def _proc_cpu(pid: int) -> float:
    """The CPU seconds (user + system) process ``pid`` has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _backends(base: str) -> dict[int, float]:
    """The CPU seconds so far of each PostgreSQL backend on the bench's database (this query's own left
    out), when the server runs on this machine (empty otherwise)."""
    import psycopg

    _POLLS[0] += 1
    with psycopg.connect(base, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return {int(pid): _proc_cpu(int(pid)) for (pid,) in rows if Path(f"/proc/{pid}").exists()}


def _pg_cpu_since(base: str, before: dict[int, float]) -> float:
    """The CPU seconds the bench database's backends used since ``before`` (:func:`_backends`)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in _backends(base).items())  # (one gone meanwhile: lost)


#: The workers' CPU seconds by kind of thread (see :func:`_thread_cpu`), by number of workers.
_THREADS: dict[int, dict[str, float]] = {}

#: The longest lateness (and net of run-queue waits) of a ticker in the bench's own, nearly idle, process
#: from the last queue run's enqueue to its end: what the machine's load alone does to a loop.
_CONTROL = [0.0, 0.0, 0.0]

#: The bench's database (no schema): where it reads the server's statistics.
_BASE = [""]

#: The PostgreSQL backends' CPU seconds of the last run (from the first enqueue, or the pool's start, to the end).
_PG_CPU = [0.0]


#: Transactions the bench itself makes while it waits (its polls), left out of the per-job count.
_POLLS = [0]


async def _registered(client: Any) -> int:
    _POLLS[0] += 1
    async with client.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM procrastinate_workers")
        return int((await cur.fetchone())[0])


async def _done(client: Any) -> tuple[int, int]:
    _POLLS[0] += 1
    async with client.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed') FROM procrastinate_jobs"
        )
        done, failed = await cur.fetchone()
        return int(done), int(failed)


def through_queue(url: str, logs: Path, sessions: int, workers: int, plan: dict[str, Any]) -> tuple[float, float]:
    """(wall seconds from the first enqueue to the last job done, seconds spent enqueueing)."""
    from saucer.queue import JobSpec, QueueClient, migrate_queue, queue_location
    from saucer.store import open_store

    settings = _settings(url, logs)
    open_store(url).close()  # the store's schema
    migrate_queue(queue_location(url))
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", url, str(logs)], stdin=subprocess.DEVNULL)
        for _ in range(workers)
    ]
    specs = [
        JobSpec(
            f"bench-{i}",
            f"bench-{i:05d}",
            "plan",
            "bench",
            {"session_id": f"bench-{i:05d}", "task": "bench", "mode": "follower", "plan": plan},
        )
        for i in range(sessions)
    ]

    async def run() -> tuple[float, float]:
        async with QueueClient(settings) as client:
            while await _registered(client) < workers:
                await asyncio.sleep(0.1)
            for proc in procs:
                proc.send_signal(signal.SIGUSR1)
            pg = await asyncio.to_thread(_backends, _BASE[0])
            t = time.perf_counter()
            await client.enqueue(specs)
            enqueued = time.perf_counter() - t
            # The control: the same ticker in this process, which only polls meanwhile (the machine's floor).
            control = asyncio.create_task(_stall_ticker(logs / "control" / "stall", _CONTROL))
            while True:
                done, failed = await _done(client)
                if done + failed >= sessions:
                    wall = time.perf_counter() - t
                    for proc in procs:
                        proc.send_signal(signal.SIGUSR2)
                    control.cancel()
                    assert failed == 0, f"{failed} jobs failed"
                    _PG_CPU[0] = await asyncio.to_thread(_pg_cpu_since, _BASE[0], pg)
                    return wall, enqueued
                await asyncio.sleep(0.05)

    try:
        return asyncio.run(run())
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        _CPU[0] = sum(float(p.read_text() or 0) for p in logs.glob("cpu-*"))
        by_thread: dict[str, float] = {}
        for p in logs.glob("threads-*"):
            for line in p.read_text().splitlines():
                kind, cpu = line.rsplit(" ", 1)
                by_thread[kind] = by_thread.get(kind, 0.0) + float(cpu)
        _THREADS[workers] = by_thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--steps-per-session", type=int, default=3, help="command steps in each session's plan")
    parser.add_argument("--postgres-url", default=os.environ.get("SAUCER_TEST_POSTGRES_URL"))
    parser.add_argument("--worker", nargs=2, metavar=("URL", "LOGS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker_main(*args.worker)
        return 0
    if not args.postgres_url:
        print(
            "bench/queue_bench.py skipped: the queue needs PostgreSQL; set SAUCER_TEST_POSTGRES_URL or pass --postgres-url"
        )
        return 0
    n = args.sessions
    _BASE[0] = args.postgres_url
    plan = plan_of(args.steps_per_session)
    print(
        f"{n} follower sessions ({args.steps_per_session} steps each, an instant in-process tool), "
        "PostgreSQL store, 4 sessions at once per process"
    )
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start\n")
    print(
        f"{'run':40} {'wall s':>8} {'sessions/s':>11} {'enqueue ms/job':>15} {'loop stall ms':>14}"
        f" {'(own)':>6} {'longest GC ms':>16} {'commits/job':>12} {'CPU ms/job':>11} {'PG CPU ms/job':>14}",
        flush=True,
    )
    rows = []

    stalls: list[tuple[float, float]] = []
    commits: dict[str, float] = {}
    cpus: dict[str, float] = {}

    def row(
        name: str, wall: float, enqueue: float | None, stall: tuple[float, float] | None, txs: float, gc_: str
    ) -> None:
        rows.append((name, wall, enqueue))
        if stall is not None:
            stalls.append(stall)
        commits[name] = txs
        cpus[name] = _CPU[0] / n * 1000
        late, own = (f"{stall[0] * 1000:14.1f}", f"{stall[1] * 1000:6.1f}") if stall else ("", "")
        print(
            f"{name:40} {wall:8.2f} {n / wall:11.1f} {'' if enqueue is None else f'{enqueue / n * 1000:15.2f}':>15}"
            f" {late:>14} {own:>6} {gc_:>16} {txs:12.2f} {cpus[name]:11.2f}"
            f" {_PG_CPU[0] / n * 1000:14.2f}",
            flush=True,
        )

    controls: list[float] = []

    def counted(run: Callable[[str], Any]) -> tuple[Any, float]:
        """``run(url)`` on a schema of its own (dropped afterwards), and the database's commits per session it made."""
        url, schema = _schema_url(args.postgres_url)
        before, polls = _commits(args.postgres_url), _POLLS[0]
        try:
            out = run(url)
            return out, (_commits(args.postgres_url) - before - (_POLLS[0] - polls)) / n
        finally:
            _drop(args.postgres_url, schema)

    with tempfile.TemporaryDirectory() as tmp:
        base, txs = counted(lambda url: one_process(url, Path(tmp) / "logs0", n, plan))
        row("one process (SessionPool, no queue)", base, None, None, txs, "")
        for w in args.workers:
            (wall, enqueue), txs = counted(lambda url, w=w: through_queue(url, Path(tmp) / f"logs{w}", n, w, plan))  # type: ignore[misc]
            name = f"queue, {w} worker process{'es' if w > 1 else ''}"
            logs = Path(tmp) / f"logs{w}"
            row(name, wall, enqueue, _longest_stall(logs), txs, _longest_gc(logs))
            controls.append(_CONTROL[0])
            _CONTROL[:] = [0.0, 0.0, 0.0]
    walls = {name.split(",")[1].split()[0]: wall for name, wall, _ in rows if name.startswith("queue, ")}
    one_worker = walls.get("1")
    if one_worker is not None:
        print(
            f"\nqueue overhead per job (1 worker minus one process, same concurrency): "
            f"{(one_worker - base) / n * 1000:.1f} ms   target <= 2.5 ms"
        )
        if "2" in walls:
            print(f"2 workers / 1 worker, sessions per second: {one_worker / walls['2']:.2f}x   target >= 1.7x")
    if stalls:
        print(
            f"longest event-loop stall in a worker: {max(s[0] for s in stalls) * 1000:.1f} ms   target <= 5 ms; "
            f"{max(s[1] for s in stalls) * 1000:.1f} ms net of its thread's waits for a core (the machine's other load); "
            f"{max(controls) * 1000:.1f} ms in the bench's own nearly idle process meanwhile (the machine's floor)"
        )
    queued = [txs for name, txs in commits.items() if name.startswith("queue, ")]
    if queued:
        print(
            f"database commits per job (pg_stat_database, the whole run: enqueue, queue, sessions): "
            f"{min(queued):.2f} through the queue, {commits['one process (SessionPool, no queue)']:.2f} without it "
            "(exact only when nothing else uses the bench's database)"
        )
    if "queue, 1 worker process" in cpus:
        print(
            f"CPU per job (the one process's; the workers' together, from the queueing on, start-up left out): "
            f"{cpus['queue, 1 worker process'] - cpus['one process (SessionPool, no queue)']:.2f} ms more through "
            "1 worker than without the queue (PostgreSQL's own CPU not counted)"
        )
    for w, by_thread in _THREADS.items():
        spent = ", ".join(f"{k} {v / n * 1000:.2f}" for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v)
        print(f"CPU ms per job by thread, {w} worker{'s' if w > 1 else ''}: {spent}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end (other work on the machine moves these figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
