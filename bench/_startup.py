"""Session start-up figures for ``bench/engine.py``: before (tools isolated over stdio) and after (in-process).

Whole processes, process start to exit, run interleaved so they see the same
machine load (wall time and CPU time, medians):

* ``python -c pass`` and ``saucer --help`` (the CLI's own start-up);
* ``saucer run --plan one.json``: a one-step follower plan (``files.stat``),
  with the built-in tools in-process (after) and with ``SAUCER_MCP__ISOLATE=true``
  (before: the shell and files servers as stdio processes);
* ``saucer run --plan DIR -c 4``: four plans of one 1-second step each.

In-process, in a child process of its own (imports already done, as in a
service or a long batch):

* ``start-session``: one-step follower sessions made by a ``SessionFactory``
  with the default local dispatcher, one after another, each opening its
  dispatcher cold (no shared scope): the time to the tools being listed, and
  the whole session (create, run, end); then the same sessions inside one
  ``share_tool_servers()`` scope (as a pool and ``saucer run`` have them);
  the first session, which also builds the in-process servers, on its own;
* ``batch4``: four sessions of one ``sleep 1`` step through a ``SessionPool``
  (concurrency 4), tool servers started by the pool;
* ``pool-builtin``: 1,000 one-step follower sessions through a pool of 4 on
  the built-in tools, which the pool starts once. Before, every session
  started its own servers: that is measured on a few sessions and scaled.

Targets (issue 15): in-process session start with the built-in tools
<= 20 ms; a one-step ``saucer run --plan`` within ``bench/startup.py``'s target of the CLI's own
start-up (issue 29: 1.5x, the one figure both benches judge by); the
batch of 4 one-second plans with concurrency 4 in <= 1.5 s.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from startup import TARGET as RUN_TARGET  # bench/startup.py: a one-step run against --help

STARTUP_SCENARIOS = [
    "start-session",
    "start-session-isolated",
    "batch4",
    "batch4-isolated",
    "pool-builtin",
    "pool-builtin-unshared-isolated",
]

_ONE_STEP = {
    "task": "one",
    "steps": [{"subtask": "look", "commands": [{"tool_name": "files.stat", "parameters": {"path": "."}}]}],
}
_SLEEP_STEP = {
    "task": "nap",
    "steps": [{"subtask": "nap", "commands": [{"tool_name": "shell.run", "parameters": {"command": "sleep 1"}}]}],
}


def _settings(tmp: Path, isolate: bool) -> Any:
    from saucer.config import load_settings

    return load_settings(
        overrides={
            "store.url": "memory://",
            "logs.root": str(tmp / "logs"),
            "system.save_experience": "always_not",
            "mcp.isolate": isolate,
        }
    )


def _factory(tmp: Path, isolate: bool, dispatcher_factory: Callable[..., Any] | None = None) -> Any:
    from saucer.engine import SessionFactory

    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    return SessionFactory(_settings(tmp, isolate), workspace=workspace, dispatcher_factory=dispatcher_factory)


def _start_session(tmp: Path, isolate: bool, count: int) -> dict[str, Any]:
    from saucer.dispatch.shared import share_tool_servers

    factory = _factory(tmp, isolate)
    to_tools: list[float] = []
    whole: list[float] = []
    in_scope: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        [session] = factory.create_session(f"s{i}", "follower", _ONE_STEP)
        tools = await session.tools()
        listed = time.perf_counter()
        result = await session.run()
        ended = time.perf_counter()
        assert result.ok and {"shell.run", "files.stat"} <= set(tools), result
        to_tools.append((listed - started) * 1e3)
        whole.append((ended - started) * 1e3)

    async def all_of_them() -> None:
        for i in range(count):
            await one(i)
        # The same sessions inside one shared scope, as a pool or `saucer run` has them.
        async with share_tool_servers():
            for i in range(count):
                started = time.perf_counter()
                [session] = factory.create_session(f"w{i}", "follower", _ONE_STEP)
                assert (await session.run()).ok
                in_scope.append((time.perf_counter() - started) * 1e3)

    asyncio.run(all_of_them())
    rest = slice(1, None) if count > 1 else slice(None)
    return {
        "sessions": count,
        "first_ms": whole[0],
        "tools_ms": statistics.median(to_tools[rest]),
        "session_ms": statistics.median(whole[rest]),
        "shared_session_ms": statistics.median(in_scope[rest]),
    }


def _pool(tmp: Path, isolate: bool, plan: dict[str, Any], count: int, unshared: bool = False) -> dict[str, Any]:
    from saucer.engine import SessionPool

    make = None
    if unshared:
        from saucer.engine.factory import local_dispatcher_factory

        shared_make = local_dispatcher_factory(_settings(tmp, isolate), tmp / "workspace")

        def make(session: Any) -> Any:
            # Made in an empty context: outside the pool's shared scope, as every session was before.
            return contextvars.Context().run(shared_make, session)

    factory = _factory(tmp, isolate, make)
    sessions = [s for i in range(count) for s in factory.create_session(f"p{i}", "follower", plan)]
    started = time.perf_counter()
    results = asyncio.run(SessionPool(sessions, max_concurrency=4).run_all())
    wall = time.perf_counter() - started
    assert all(r.ok for r in results), [r.reason for r in results if not r.ok][:3]
    return {"sessions": count, "wall_s": wall, "ms_per_session": wall / count * 1e3}


def run_startup(name: str, quick: bool) -> dict[str, Any]:
    """One in-process scenario, in the current directory (a fresh temporary one), its imports done first."""
    import jsonschema  # noqa: F401 - parameters that need a message are checked with it; imported on demand

    import saucer.agents.follower  # noqa: F401
    import saucer.dispatch.local  # noqa: F401 - the whole-process figures include the imports

    tmp = Path.cwd()
    if name == "start-session":
        return _start_session(tmp, False, 30 if quick else 100)
    if name == "start-session-isolated":
        return _start_session(tmp, True, 3 if quick else 5)
    if name == "batch4":
        return _pool(tmp, False, _SLEEP_STEP, 4)
    if name == "batch4-isolated":
        return _pool(tmp, True, _SLEEP_STEP, 4, unshared=True)
    if name == "pool-builtin":
        return _pool(tmp, False, _ONE_STEP, 100 if quick else 1000)
    if name == "pool-builtin-unshared-isolated":
        return _pool(tmp, True, _ONE_STEP, 4 if quick else 8, unshared=True)
    raise ValueError(name)


# -- whole processes ------------------------------------------------------------------


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the child and its children) of one run; a failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def whole_processes(tmp: Path, env: dict[str, str], repeat: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of each command, the commands interleaved ``repeat`` times."""
    saucer = shutil.which("saucer", path=str(Path(sys.executable).parent)) or ""
    cli = [saucer] if saucer else [sys.executable, "-m", "saucer"]
    (tmp / "one.json").write_text(json.dumps(_ONE_STEP))
    batch = tmp / "batch"
    batch.mkdir(exist_ok=True)
    for i in range(4):
        (batch / f"nap{i}.json").write_text(json.dumps({**_SLEEP_STEP, "task": f"nap{i}"}))
    base = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a user runs it: bytecode cached
    isolated = dict(base, SAUCER_MCP__ISOLATE="true")
    run = [*cli, "run", "--store", "memory://", "--yes"]
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "python -c pass": ([sys.executable, "-c", "pass"], base),
        "saucer --help": ([*cli, "--help"], base),
        "saucer run --plan one.json (in-process tools)": ([*run, "--plan", "one.json"], base),
        "saucer run --plan one.json (isolated: stdio tools)": ([*run, "--plan", "one.json"], isolated),
        "saucer run --plan batch/ -c 4, 4 x 1 s (in-process)": ([*run, "--plan", "batch", "-c", "4"], base),
        "saucer run --plan batch/ -c 4, 4 x 1 s (isolated)": ([*run, "--plan", "batch", "-c", "4"], isolated),
    }
    for cmd, cmd_env in commands.values():  # warm the bytecode and file caches once
        _timed(cmd, tmp, cmd_env)
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in commands}
    for _ in range(repeat):
        for label, (cmd, cmd_env) in commands.items():
            samples[label].append(_timed(cmd, tmp, cmd_env))
    return {
        label: {"wall_s": statistics.median(w for w, _ in runs), "cpu_s": statistics.median(c for _, c in runs)}
        for label, runs in samples.items()
    }


def report(child: Callable[[str], dict[str, Any]], tmp: Path, env: dict[str, str], repeat: int, console: Any) -> None:
    """Measure every start-up figure and print them with PASS/MISS against the issue's targets."""
    from rich.table import Table

    procs = whole_processes(tmp, env, repeat)
    inproc = {name: child(name) for name in STARTUP_SCENARIOS}

    table = Table(
        title="session start-up (medians; wall time, and CPU time of the process and its children)",
        title_justify="left",
    )
    for col in ("what", "wall", "CPU", "target", ""):
        table.add_column(col, justify="left" if col == "what" else "right")

    def verdict(ok: bool) -> str:
        return "[green]PASS[/]" if ok else "[red]MISS[/]"

    help_s = procs["saucer --help"]["wall_s"]
    for label, figures in procs.items():
        target, mark = "", ""
        if label == "saucer run --plan one.json (in-process tools)":
            ratio = figures["wall_s"] / help_s
            target, mark = f"<= {RUN_TARGET}x --help ({ratio:.1f}x)", verdict(ratio <= RUN_TARGET)
        elif label.startswith("saucer run --plan one.json"):
            target = f"({figures['wall_s'] / help_s:.1f}x --help)"
        table.add_row(label, f"{figures['wall_s']:.2f} s", f"{figures['cpu_s']:.2f} s", target, mark)

    after, before = inproc["start-session"], inproc["start-session-isolated"]
    table.add_row(
        f"in-process session start to tools listed, built-in tools in-process ({after['sessions'] - 1} sessions)",
        f"{after['tools_ms']:.1f} ms",
        "",
        "<= 20 ms",
        verdict(after["tools_ms"] <= 20),
    )
    table.add_row(
        "  the whole one-step session (create, start, step, end)",
        f"{after['session_ms']:.1f} ms",
        "",
        "<= 20 ms",
        verdict(after["session_ms"] <= 20),
    )
    table.add_row(
        "  the whole one-step session in a shared scope (a pool, saucer run)",
        f"{after['shared_session_ms']:.1f} ms",
        "",
        "<= 20 ms",
        verdict(after["shared_session_ms"] <= 20),
    )
    table.add_row(
        "  the first session of the process (builds the in-process servers)", f"{after['first_ms']:.1f} ms", "", "", ""
    )
    table.add_row(
        f"in-process session start to tools listed, isolated stdio tools ({before['sessions'] - 1} sessions, before)",
        f"{before['tools_ms']:.0f} ms",
        "",
        "",
        "",
    )
    table.add_row("  the whole one-step session, isolated (before)", f"{before['session_ms']:.0f} ms", "", "", "")
    batch, batch_before = inproc["batch4"], inproc["batch4-isolated"]
    table.add_row(
        "4 sessions x one 1-second step, pool(4), in-process tools",
        f"{batch['wall_s']:.2f} s",
        "",
        "<= 1.5 s",
        verdict(batch["wall_s"] <= 1.5),
    )
    table.add_row(
        "  the same, isolated tools started per session (before)", f"{batch_before['wall_s']:.2f} s", "", "", ""
    )
    pool, pool_before = inproc["pool-builtin"], inproc["pool-builtin-unshared-isolated"]
    table.add_row(
        f"{pool['sessions']:,} one-step sessions, pool(4), built-in tools started once",
        f"{pool['wall_s']:.2f} s",
        "",
        f"{pool['ms_per_session']:.1f} ms/session",
        "",
    )
    scaled = pool_before["ms_per_session"] * pool["sessions"] / 1e3
    table.add_row(
        f"  before: isolated tools per session ({pool_before['sessions']} measured, scaled to {pool['sessions']:,})",
        f"~{scaled:.0f} s",
        "",
        f"{pool_before['ms_per_session']:.0f} ms/session",
        "",
    )
    console.print(table)
    console.print(
        f"Load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (wall times on a shared machine "
        "vary with it; CPU times much less)."
    )
