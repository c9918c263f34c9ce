"""Start-up of the command line as whole processes: a one-step ``saucer run --plan`` against ``saucer --help``.

Each command runs as a fresh process, start to exit, the commands interleaved
so they see the same machine load; the table gives the median wall time, the
median CPU time (user + system of the process and its children) and the ratio
to ``saucer --help``. Two passes:

* **bytecode compiled**: as an installed saucer runs, ``.pyc`` files cached
  (written by a warm-up run into a private ``PYTHONPYCACHEPREFIX``);
* **no bytecode**: ``PYTHONDONTWRITEBYTECODE=1`` and an empty
  ``PYTHONPYCACHEPREFIX``, so every module (the standard library's too, bar the
  frozen ones) is compiled from source in every run, as on a first run or where
  bytecode cannot be written.

The plan is one ``files.write`` step with the SQLite store (``--store
sqlite:///s.db``), in a fresh directory per run. Target (issue 29, item 4):
the run <= 1.5x ``saucer --help`` in both passes.

    .venv/bin/python bench/startup.py              # 7 interleaved runs of each command per pass
    .venv/bin/python bench/startup.py --repeat 11
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN = {
    "task": "one",
    "steps": [
        {"subtask": "s", "commands": [{"tool_name": "files.write", "parameters": {"path": "a", "content": "x"}}]}
    ],
}
TARGET = 1.5
COMMANDS = ("python -c pass", "saucer --help", "saucer run --plan plan.json")


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the child and its children) of one run; a failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cli() -> list[str]:
    saucer = shutil.which("saucer", path=str(Path(sys.executable).parent))
    return [saucer] if saucer else [sys.executable, "-m", "saucer"]


def measure(tmp: Path, bytecode: bool, repeat: int) -> dict[str, list[tuple[float, float]]]:
    """``repeat`` interleaved (wall, CPU) samples of each command, in one pass (bytecode cached or not)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["SAUCER_SYSTEM__SAVE_EXPERIENCE"] = "always_not"
    cache = tmp / ("pyc" if bytecode else "no-pyc")
    cache.mkdir()
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    cli = _cli()
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "saucer --help": [*cli, "--help"],
        "saucer run --plan plan.json": [*cli, "run", "--plan", "plan.json", "--store", "sqlite:///s.db"],
    }
    runs = 0

    def fresh_dir() -> Path:
        nonlocal runs
        runs += 1
        where = tmp / f"run{runs}"
        where.mkdir()
        (where / "plan.json").write_text(json.dumps(PLAN))
        return where

    for cmd in commands.values():  # warm the file cache (and, in the bytecode pass, write the bytecode)
        _timed(cmd, fresh_dir(), env)
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in commands}
    for _ in range(repeat):
        for label, cmd in commands.items():
            samples[label].append(_timed(cmd, fresh_dir(), env))
    return samples


def main() -> int:
    """Measure both passes and print the table with the target beside the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="interleaved runs of each command per pass (default 7)")
    args = parser.parse_args()
    repeat = max(1, args.repeat)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(
        title=f"start-up as whole processes (medians of {repeat}; wall time, CPU of the process and its children)",
        title_justify="left",
    )
    for col in ("pass", "command", "wall", "min–max", "CPU", "x --help (wall)", "x --help (CPU)", "target", ""):
        table.add_column(col, justify="left" if col in ("pass", "command") else "right")
    load_before = os.getloadavg()[0]
    for bytecode in (True, False):
        with tempfile.TemporaryDirectory() as d:
            samples = measure(Path(d), bytecode, repeat)
        wall = {k: statistics.median(w for w, _ in v) for k, v in samples.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in samples.items()}
        for label in COMMANDS:
            target, mark = "", ""
            if label.startswith("saucer run"):
                ok = wall[label] / wall["saucer --help"] <= TARGET
                target, mark = f"<= {TARGET}x", "[green]PASS[/]" if ok else "[red]MISS[/]"
            walls = [w for w, _ in samples[label]]
            table.add_row(
                "bytecode compiled" if bytecode else "no bytecode",
                label,
                f"{wall[label]:.3f} s",
                f"{min(walls):.3f}–{max(walls):.3f}",
                f"{cpu[label]:.3f} s",
                f"{wall[label] / wall['saucer --help']:.2f}x",
                f"{cpu[label] / cpu['saucer --help']:.2f}x",
                target,
                mark,
            )
        table.add_section()
    console.print(table)
    console.print(
        f"Load average: {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end, on {os.cpu_count()} CPUs "
        "(wall times on a shared machine vary with it; CPU times much less)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
