"""What kernel confinement costs per command: the shell tool running ``true``, confined and not.

    python bench/confinement.py [--iterations N]

Each mode runs ``true`` through the real shell tool (``run_command``: the
rule check, the gate, the process group, the output pipes) ``--iterations``
times (200 by default) one after the other, after 10 runs to warm up, and
prints the median, p90 and the median added over ``off``:

* ``off``: no confinement (``[shell] sandbox = "off"``), the floor;
* ``landlock``: a thread restricts itself with Landlock and starts the command;
* ``bubblewrap``: the command is started by ``bwrap`` (new mount and PID namespaces).

A mode this machine lacks is printed as unavailable. The target is at most
2 ms added per command.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from saucer.tools.confine import resolve
from saucer.tools.shell import ShellOptions, run_command

TARGET_MS = 2.0


async def main(iterations: int) -> None:
    """Measure every available mode, interleaved (one command of each in turn, so load hits all alike)."""
    with tempfile.TemporaryDirectory() as root:
        modes, options = [], {}
        for mode in ("off", "landlock", "bubblewrap"):
            found = resolve(mode)
            if found.error is not None:
                print(f"{mode:<12} unavailable: {found.error}")
                continue
            modes.append(mode)
            options[mode] = ShellOptions.create(root, sandbox=mode, env={"PATH": "/usr/bin:/bin"})
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for index in range(iterations + 10):
            for mode in modes:
                started = time.perf_counter()
                result = await run_command("true", options[mode])
                elapsed = (time.perf_counter() - started) * 1000
                assert result.exit_code == 0, result
                if index >= 10:  # the first ten warm up
                    times[mode].append(elapsed)
        print(
            f"{'mode':<12} {'median ms':>10} {'p90 ms':>8} {'added ms':>9}  ({iterations} x `true` through the shell tool)"
        )
        floor = statistics.median(times["off"]) if "off" in times else None
        for mode in modes:
            ordered = sorted(times[mode])
            median, p90 = statistics.median(ordered), ordered[int(len(ordered) * 0.9) - 1]
            added = median - floor if floor is not None else float("nan")
            verdict = (
                ""
                if mode == "off"
                else ("  PASS" if added <= TARGET_MS else "  MISS") + f" (target <= {TARGET_MS:g} ms)"
            )
            print(f"{mode:<12} {median:>10.2f} {p90:>8.2f} {added:>9.2f}{verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="commands per mode (default 200)")
    asyncio.run(main(parser.parse_args().iterations))
