"""Scale benchmark: the CLI's inspection commands at real scale, timed as whole processes with their peak memory.

    .venv/bin/python bench/scale.py                              # issue 21's sizes: 10^4 sessions, 10^5 events
    .venv/bin/python bench/scale.py --sessions 500 --events 3000 # a quick run
    .venv/bin/python bench/scale.py --build-only                 # only build (or find) the workloads

Workloads (built once into ``--cache``, default ``~/.cache/saucer/bench-scale/S<sessions>-E<events>-w2``,
and reused, even by a newer saucer, which upgrades them on first open: ``--rebuild`` builds
them again with the current code, e.g. to see what today's record format costs; ``w2``: built by a
saucer whose closing snapshot holds each packed value whole, which ``state`` reads without folding
tails, so a cache built before that is not taken for one):

``sessions.db``  ``--sessions`` follower sessions in one SQLite file, each a 3-step plan on the
                 built-in tools (``files.write``, ``files.read``, ``files.stat``, in-process),
                 run by a ``SessionPool`` of 4 through the real engine and Context commits.
``long.db``      one follower session whose plan has ``--events``/3 steps of ``files.stat``
                 (each plan step is a round: round start, the step, round end = 3 events),
                 run through the real engine: about ``--events`` events.
``plans.db``     two sessions of ``--plan-steps`` steps: one whose plan carries ``--plan-mb`` MB
                 (padded subtasks) and one with a tiny plan; the build prints the cost of a
                 commit (a step's wall time) of each.

Measured, each command a separate ``saucer`` process (``python -m saucer``), its wall time
and its peak RSS (``ru_maxrss`` of the waited child, so only that process), stdout to a
file (a pipe: the plain, non-terminal output): ``sessions``, ``sessions --json`` over
``sessions.db``; ``show``, ``show --json``, ``history``, ``history --json``, ``export``, ``state``
of the long session; and, in a child of its own (saucer imported before the clock), opening
the long engine session in Python: ``open_store``, what ``Session.resume`` reads (the stored
session meta without its plan, which a resume reads when a step of it is first needed, and the
newest cursor, where this saucer has them) and ``Context.open`` at its head
(``bench/engine_open.py`` times the whole resume). A file built by an older saucer is opened
once, untimed, before (its schema upgrade is not a command's cost), and each command runs once
untimed before it is timed, so that it runs as an installed saucer does, with its modules'
bytecode cached (``PYTHONDONTWRITEBYTECODE`` is dropped for the children). Medians of ``--repeat``
runs, beside issue 21's targets; MISS marks a figure over its target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: (command label, saucer argv after the store option is added, which workload, target seconds, target MB)
COMMANDS: list[tuple[str, list[str], str, float | None, float | None]] = [
    ("sessions", ["sessions"], "sessions", 0.3, None),
    ("sessions --json", ["sessions", "--json"], "sessions", 0.3, None),
    ("show", ["show", "long"], "long", 3.0, None),
    ("show --limit 50", ["show", "long", "--limit", "50"], "long", 3.0, None),
    ("show --json", ["show", "long", "--json"], "long", 3.0, 150.0),
    ("history", ["history", "long"], "long", None, 150.0),  # the issue sets no time for the plain rows
    ("history --json", ["history", "long", "--json"], "long", 3.0, 150.0),
    ("export", ["export", "long"], "long", 3.0, 150.0),
    ("state", ["state", "long"], "long", 0.2, None),
]


def _settings(cache: Path, url: str, **extra: Any) -> Any:
    from saucer.config import load_settings

    overrides = {
        "store.url": url,
        "logs.root": str(cache / "logs"),
        "logs.enabled": False,
        "system.save_experience": "always_not",
        "system.log_to_markdown": False,
        "system.max_step": 10**7,
    }
    overrides.update(extra)
    return load_settings(overrides=overrides)


def _plan(task: str, steps: int, pad: int = 0) -> dict[str, Any]:
    filler = "x" * pad
    return {
        "task": task,
        "steps": [
            {
                "subtask": f"look {i}{' ' + filler if filler else ''}",
                "commands": [{"tool_name": "files.stat", "parameters": {"path": "."}}],
            }
            for i in range(steps)
        ],
    }


async def _run(factory: Any, sessions: list[Any], concurrency: int) -> list[Any]:
    from saucer.dispatch.shared import share_tool_servers
    from saucer.engine.pool import SessionPool

    async with share_tool_servers():
        await factory.check_plans(sessions)
        if len(sessions) == 1:
            return [await sessions[0].run()]
        return await SessionPool(sessions, max_concurrency=concurrency).run_all()


def build_sessions(cache: Path, count: int) -> float:
    """``count`` three-step follower sessions in ``sessions.db``; returns the build's wall seconds."""
    from saucer.engine.factory import SessionFactory

    workspace = cache / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{cache / 'sessions.db'}"
    started = time.perf_counter()
    done = 0
    with SessionFactory(_settings(cache, url), workspace=workspace) as factory:
        while done < count:  # in chunks, so that the pool's bookkeeping stays small
            chunk = min(500, count - done)
            sessions = []
            for i in range(done, done + chunk):
                plan = {
                    "task": f"task-{i % 37}",
                    "steps": [
                        {
                            "subtask": "write a note",
                            "commands": [
                                {
                                    "tool_name": "files.write",
                                    "parameters": {"path": f"n{i % 50}.txt", "content": f"note {i}\n"},
                                }
                            ],
                        },
                        {
                            "subtask": "read it back",
                            "commands": [{"tool_name": "files.read", "parameters": {"path": f"n{i % 50}.txt"}}],
                        },
                        {
                            "subtask": "look around",
                            "commands": [{"tool_name": "files.stat", "parameters": {"path": "."}}],
                        },
                    ],
                }
                sessions += factory.create_session(plan["task"], "follower", plan=plan, session_id=f"s{i:06d}")
            results = asyncio.run(_run(factory, sessions, 4))
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"building sessions.db: {bad[0]}")
            done += chunk
            print(
                f"  sessions.db: {done:,}/{count:,} sessions ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return time.perf_counter() - started


def build_one(cache: Path, db: str, session_id: str, plan: dict[str, Any]) -> tuple[float, int]:
    """One follower session of ``plan`` in ``db``; returns (wall seconds, head version)."""
    from saucer.engine.factory import SessionFactory
    from saucer.store import open_store

    workspace = cache / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{cache / db}"
    with SessionFactory(_settings(cache, url), workspace=workspace) as factory:
        sessions = factory.create_session(plan["task"], "follower", plan=plan, session_id=session_id)
        started = time.perf_counter()
        [result] = asyncio.run(_run(factory, sessions, 1))
        wall = time.perf_counter() - started
    if not result.ok:
        raise SystemExit(f"building {db}: {result}")
    with open_store(url) as store:
        return wall, store.head(session_id)


def build(cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Build the missing workloads into ``cache``; returns what was built (and its build figures)."""
    cache.mkdir(parents=True, exist_ok=True)
    manifest_path = cache / "manifest.json"
    manifest: dict[str, Any] = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if "sessions" not in manifest:
        (cache / "sessions.db").unlink(missing_ok=True)
        wall = build_sessions(cache, args.sessions)
        manifest["sessions"] = {
            "count": args.sessions,
            "build_s": wall,
            "bytes": (cache / "sessions.db").stat().st_size,
        }
        manifest_path.write_text(json.dumps(manifest, indent=2))
    if "long" not in manifest:
        (cache / "long.db").unlink(missing_ok=True)
        steps = max(1, args.events // 3)
        print(f"  long.db: one session of {steps:,} plan steps ...", file=sys.stderr, flush=True)
        wall, head = build_one(cache, "long.db", "long", _plan("long", steps))
        manifest["long"] = {
            "plan_steps": steps,
            "events": head,
            "build_s": wall,
            "ms_per_step": wall / steps * 1e3,
            "bytes": (cache / "long.db").stat().st_size,
        }
        manifest_path.write_text(json.dumps(manifest, indent=2))
    if "plans" not in manifest:
        (cache / "plans.db").unlink(missing_ok=True)
        steps = args.plan_steps
        pad = max(0, int(args.plan_mb * 1e6 / steps) - 60)
        print(
            f"  plans.db: {steps:,} steps with a {args.plan_mb} MB plan, then with a tiny one ...",
            file=sys.stderr,
            flush=True,
        )
        big, _ = build_one(cache, "plans.db", "bigplan", _plan("bigplan", steps, pad))
        small, _ = build_one(cache, "plans.db", "smallplan", _plan("smallplan", steps))
        manifest["plans"] = {
            "steps": steps,
            "plan_bytes": len(json.dumps(_plan("bigplan", steps, pad))),
            "big_ms_per_step": big / steps * 1e3,
            "small_ms_per_step": small / steps * 1e3,
        }
        manifest_path.write_text(json.dumps(manifest, indent=2))
    return manifest


def _child(argv: list[str], out: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Run ``argv`` with stdout to ``out``; (wall seconds, peak RSS MB, exit code) of that process alone."""
    with open(out, "wb") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
    if proc.returncode != 0:
        print(f"  {' '.join(argv[3:])} exited {proc.returncode}: {stderr.strip()[-400:]}", file=sys.stderr)
    return wall, usage.ru_maxrss / 1024.0, proc.returncode


_OPEN_SNIPPET = """
import json, sys, time
import saucer.store.sqlite  # imported before the clock, as in a running program
from saucer.context import Context
from saucer.store import open_store
try:  # what Session.resume reads besides the Context: the meta without the plan (read when a step needs it)
    from saucer.engine.cursor import last_cursor, stored_session_brief as session_meta
except ImportError:  # saucer before the plan was read lazily: the whole meta, plan included
    try:
        from saucer.engine.cursor import last_cursor, stored_session_meta as session_meta
    except ImportError:
        last_cursor = session_meta = None
t = time.perf_counter()
store = open_store(sys.argv[1])
if session_meta is not None:
    session_meta(store, "long")
    last_cursor(store, "long")
ctx = Context.open(store, "long", create=False)
ms = (time.perf_counter() - t) * 1e3
print(json.dumps({"ms": ms, "version": ctx.version, "engine_meta": session_meta is not None}))
"""

_MIGRATE_SNIPPET = """
import sys
from saucer.store import open_store
open_store(sys.argv[1]).close()
"""


def measure(cache: Path, repeat: int, timeout: float) -> list[dict[str, Any]]:
    """Time each command (median of ``repeat`` runs) and the Python open."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "120"
    # As an installed saucer runs: its modules' bytecode cached (a run that must compile every module
    # from source spends ~1 s doing so). Each command runs once untimed first, which writes it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rows = []
    for db in ("sessions", "long"):  # a file built by an older saucer is upgraded on its first open: not timed
        subprocess.run(
            [sys.executable, "-c", _MIGRATE_SNIPPET, f"sqlite:///{cache / (db + '.db')}"],
            env=env,
            check=True,
            timeout=timeout,
        )
    with tempfile.TemporaryDirectory() as tmp:
        for label, argv, db, target_s, target_mb in COMMANDS:
            url = f"sqlite:///{cache / (db + '.db')}"
            full = [sys.executable, "-m", "saucer", *argv, "--store", url]
            _child(full, Path(tmp) / "out", env)  # untimed: writes the bytecode of what this command imports
            runs = [_child(full, Path(tmp) / "out", env) for _ in range(repeat)]
            size = (Path(tmp) / "out").stat().st_size
            ok = all(code == 0 for _, _, code in runs)
            rows.append(
                {
                    "label": label,
                    "s": statistics.median(r[0] for r in runs),
                    "mb": max(r[1] for r in runs),
                    "target_s": target_s,
                    "target_mb": target_mb,
                    "ok": ok,
                    "out_bytes": size,
                }
            )
            print(f"  {label}: {rows[-1]['s']:.2f} s, {rows[-1]['mb']:.0f} MB", file=sys.stderr, flush=True)
        opens = []
        for _ in range(repeat):
            proc = subprocess.run(
                [sys.executable, "-c", _OPEN_SNIPPET, f"sqlite:///{cache / 'long.db'}"],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
            )
            if proc.returncode != 0:
                raise SystemExit(f"opening the long session failed:\n{proc.stderr}")
            opens.append(json.loads(proc.stdout.strip().splitlines()[-1])["ms"] / 1e3)
        rows.append(
            {
                "label": "open the engine session in Python (store, cursor, Context)",
                "s": statistics.median(opens),
                "mb": None,
                "target_s": 0.02,
                "target_mb": None,
                "ok": True,
                "out_bytes": None,
            }
        )
    return rows


def report(manifest: dict[str, Any], rows: list[dict[str, Any]], repeat: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    s, long_, plans = manifest["sessions"], manifest["long"], manifest["plans"]
    table = Table(
        title=f"saucer scale benchmark (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {repeat}; "
        f"{s['count']:,} sessions in {s['bytes'] / 1e6:.0f} MB; one session of {long_['events']:,} events)",
        title_justify="left",
    )
    for col in (
        "command (whole process, stdout to a file)",
        "time s",
        "target s",
        "peak RSS MB",
        "target MB",
        "output MB",
        "verdict",
    ):
        table.add_column(col, justify="left" if col.startswith("command") else "right")
    for row in rows:
        met = (
            row["ok"]
            and (row["target_s"] is None or row["s"] <= row["target_s"])
            and (row["target_mb"] is None or row["mb"] is None or row["mb"] <= row["target_mb"])
        )
        table.add_row(
            row["label"],
            f"{row['s']:.3f}" if row["s"] < 1 else f"{row['s']:.2f}",
            "-" if row["target_s"] is None else f"≤ {row['target_s']:g}",
            "-" if row["mb"] is None else f"{row['mb']:.0f}",
            "-" if row["target_mb"] is None else f"≤ {row['target_mb']:g}",
            "-" if row["out_bytes"] is None else f"{row['out_bytes'] / 1e6:.1f}",
            ("PASS" if met else "MISS") if row["ok"] else "FAILED",
        )
    console.print(table)
    console.print(
        f"build: {s['count']:,} sessions in {s['build_s']:.0f} s; the long session ({long_['plan_steps']:,} plan steps, "
        f"{long_['bytes'] / 1e6:.0f} MB file) at {long_['ms_per_step']:.2f} ms per step; "
        f"{plans['steps']:,} steps with a {plans['plan_bytes'] / 1e6:.1f} MB plan at {plans['big_ms_per_step']:.2f} ms per step "
        f"against {plans['small_ms_per_step']:.2f} ms with a tiny plan (ratio {plans['big_ms_per_step'] / plans['small_ms_per_step']:.2f}, "
        f"target ≤ 1.2). Load average at the end: {os.getloadavg()[0]:.2f}."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000, help="sessions in sessions.db (default 10,000)")
    parser.add_argument("--events", type=int, default=100_000, help="events of the long session (default 100,000)")
    parser.add_argument("--plan-mb", type=float, default=2.0, help="size of the big plan in MB (default 2)")
    parser.add_argument(
        "--plan-steps", type=int, default=1000, help="steps of the big- and tiny-plan sessions (default 1,000)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="where the workloads are kept (default ~/.cache/saucer/bench-scale/S<n>-E<n>-w2)",
    )
    parser.add_argument("--rebuild", action="store_true", help="build the workloads again with the current code")
    parser.add_argument("--build-only", action="store_true", help="build (or find) the workloads, measure nothing")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each command; the table shows medians (default 3)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one command may take")
    args = parser.parse_args()
    if args.sessions < 1 or args.events < 3 or args.plan_steps < 1:
        parser.error("--sessions must be >= 1, --events >= 3 and --plan-steps >= 1")
    cache = args.cache or Path.home() / ".cache" / "saucer" / "bench-scale" / f"S{args.sessions}-E{args.events}-w2"
    if args.rebuild and cache.exists():
        shutil.rmtree(cache)
    sys.path.insert(0, str(ROOT / "src"))
    manifest = build(cache, args)
    if args.build_only:
        print(json.dumps(manifest, indent=2))
        return 0
    rows = measure(cache, max(1, args.repeat), args.timeout)
    report(manifest, rows, max(1, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
