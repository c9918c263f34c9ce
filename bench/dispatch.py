"""Dispatcher overhead: latency per command and commands per second, in-process and over stdio.

    python bench/dispatch.py [--iterations N] [--batch N]

Each transport runs a trivial ``echo`` tool (served by this same file with
``--serve`` for stdio) in four ways, side by side:

* ``raw client``: the MCP SDK's ``Client.call_tool`` alone, the floor;
* ``dispatcher``: ``LocalCommandDispatcher.execute_commands`` with one command per batch;
  its p50 minus the raw p50 is the dispatcher's own overhead per command;
* ``batch``: one batch of ``--batch`` commands, run in order;
* ``batch parallel``: the same commands marked data_collection with ``parallel_data_collection``.

Latencies are per command (p50 and p99 in microseconds); throughput is
commands per second over the whole measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer

from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus

server = MCPServer("bench", log_level="WARNING")


@server.tool()
async def echo(text: str) -> str:
    """Return ``text`` (async, so no worker-thread hop blurs the dispatcher's cost)."""
    return text


def _stdio_table() -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(Path(__file__).resolve()), "--serve"], "stderr": "discard"}


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _timed(call: Callable[[], Awaitable[Any]], iterations: int) -> tuple[list[float], float]:
    for _ in range(min(50, iterations)):  # warm up: connection, caches, validators
        await call()
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(iterations):
        t0 = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - t0)
    return samples, time.perf_counter() - started


async def _measure(label: str, target: Any, table: Any, iterations: int, batch: int) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []

    def row(way: str, samples: list[float], elapsed: float, count: int) -> None:
        rows.append(
            (
                label,
                way,
                f"{_percentile(samples, 0.5) * 1e6:,.0f}",
                f"{_percentile(samples, 0.99) * 1e6:,.0f}",
                f"{count / elapsed:,.0f}",
            )
        )

    async with Client(target, cache=None) as client:
        samples, elapsed = await _timed(lambda: client.call_tool("echo", {"text": "hi"}), iterations)
        row("raw client", samples, elapsed, iterations)

    async with LocalCommandDispatcher.from_servers({"b": table}) as dispatcher:
        one = [Command(tool_name="b.echo", parameters={"text": "hi"})]

        async def single() -> None:
            [result] = await dispatcher.execute_commands(one)
            assert result.status == ResultStatus.SUCCESS, result.error

        samples, elapsed = await _timed(single, iterations)
        row("dispatcher", samples, elapsed, iterations)

    for way, parallel, kind in (("batch", False, "action"), ("batch parallel", True, "data_collection")):
        async with LocalCommandDispatcher.from_servers({"b": table}, parallel_data_collection=parallel) as dispatcher:
            commands = [Command(tool_name="b.echo", parameters={"text": "hi"}, tool_type=kind) for _ in range(batch)]

            async def whole(
                dispatcher: LocalCommandDispatcher = dispatcher, commands: list[Command] = commands
            ) -> None:
                results = await dispatcher.execute_commands(commands)
                assert all(r.status == ResultStatus.SUCCESS for r in results)

            rounds = max(3, iterations // batch)
            samples, elapsed = await _timed(whole, rounds)
            row(f"{way} of {batch}", [s / batch for s in samples], elapsed, rounds * batch)
    return rows


async def _main(iterations: int, batch: int) -> None:
    stdio = StdioServerParameters(command=sys.executable, args=[str(Path(__file__).resolve()), "--serve"])
    rows = await _measure("in-process", server, server, iterations, batch)
    rows += await _measure("stdio", stdio, _stdio_table(), iterations, batch)
    header = ("server", "how", "p50 µs/cmd", "p99 µs/cmd", "cmds/s")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"python {sys.version.split()[0]}, {iterations} single calls, batches of {batch}")
    for line in [header, tuple("-" * w for w in widths), *rows]:
        print(
            "  ".join(
                cell.rjust(w) if i >= 2 else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=False))
            )
        )
    by = {(r[0], r[1]): float(r[2].replace(",", "")) for r in rows}
    for label in ("in-process", "stdio"):
        overhead = by[(label, "dispatcher")] - by[(label, "raw client")]
        print(f"dispatcher overhead per command ({label}, p50): {overhead:,.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000, help="single-command calls per measurement")
    parser.add_argument("--batch", type=int, default=100, help="commands per batch in the batch rows")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        server.run("stdio")
        return
    asyncio.run(_main(args.iterations, args.batch))


if __name__ == "__main__":
    main()
