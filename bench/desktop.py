"""Desktop server latency: screenshot, UI tree and click on GNOME Calculator under Xvfb.

    python bench/desktop.py [--iterations N] [--in-process] [--observation]

Starts a private virtual desktop (Xvfb 1280x800x24, D-Bus, AT-SPI), launches
gnome-calculator through the desktop server and times each call as a session
makes it: ``LocalCommandDispatcher.execute_commands`` on the stdio server
(``--in-process`` builds the server in this process instead, which leaves
out the MCP stdio hop). Prints p50 and p99 in milliseconds per call, and the
cost of one look at the desktop as ``system.save_ui_tree`` and the operator
agent take it before a step (a tree and a screenshot).

``--observation`` measures instead what the operator agent does before each
model call on four applications (GNOME Calculator, Mousepad, a Zenity form,
Thunar): one look (tree + screenshot) and the tree summary, p50 and p99, and
where in the summary the element a typing task needs (the editable text)
is: its line and the characters before it.

Needs the Debian packages xvfb, at-spi2-core, dbus and gnome-calculator
(and mousepad, zenity, thunar for ``--observation``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from saucer.agents.operator import summarize_tree
from saucer.dispatch import Command, DesktopServer, LocalCommandDispatcher, default_servers
from saucer.engine.uitree import look
from saucer.tools.desktop.server import Desktop, DesktopOptions, build_server
from saucer.tools.desktop.virtual import VirtualDesktop, missing_packages


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _call(dispatcher: LocalCommandDispatcher, tool: str, **parameters: Any) -> Any:
    [result] = await dispatcher.execute_commands([Command(tool_name=f"desktop.{tool}", parameters=parameters)])
    if result.status.value != "success":
        raise SystemExit(f"desktop.{tool} failed: {result.error}")
    return result.result


async def _measure(dispatcher: LocalCommandDispatcher, iterations: int) -> list[tuple[str, list[float], str]]:
    launched = await _call(dispatcher, "launch", command="gnome-calculator", wait=60)
    tree = await _call(dispatcher, "ui_tree", app="gnome-calculator")
    nodes = tree["node_count"]
    ids: dict[str, str] = {}
    stack = [tree["tree"]]
    while stack:
        node = stack.pop()
        if node["role"] == "label":
            ids.setdefault(node["name"], node["id"])
        stack.extend(node.get("children", ()))

    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("screenshot, full screen", "screenshot", {}, "1280x800 PNG"),
        ("screenshot, scale 0.5", "screenshot", {"scale": 0.5}, "640x400 PNG"),
        ("ui_tree, calculator window", "ui_tree", {}, f"{nodes} nodes"),
        ("ui_tree, saved, not returned", "ui_tree", {"save_as": "tree", "include_tree": False}, f"{nodes} nodes"),
        ("find name='7'", "find", {"name": "7"}, "walks the window"),
        ("click element_id (action)", "click", {"element_id": ids["7"]}, "label inside a button"),
        ("click element_id (pointer)", "click", {"element_id": ids["7"], "method": "pointer"}, "XTEST click"),
        ("click name='7' (action)", "click", {"name": "7", "app": "gnome-calculator"}, "search + action"),
        ("click x, y (pointer)", "click", {"x": 5, "y": 790}, "XTEST click only"),
        ("press_keys Escape", "press_keys", {"keys": "Escape"}, "XTEST key"),
    ]
    rows = []
    # One look as save_ui_tree takes it before a step, and as the operator agent takes it (tree returned).
    for label, kwargs, note in [
        ("save_ui_tree look (tree + screenshot)", {"save_tree": True}, "2 calls, both saved"),
        ("operator look (tree returned + shot)", {"save_tree": False, "include_tree": True}, "before each model call"),
    ]:
        samples = []
        for i in range(iterations + 3):
            started = time.perf_counter()
            view = await look(dispatcher, f"bench-{i % 5}", **kwargs)
            if view.errors:
                raise SystemExit(f"look failed: {view.errors}")
            if i >= 3:
                samples.append(time.perf_counter() - started)
        rows.append((label, samples, note))
    view = await look(dispatcher, "bench-summary", save_tree=False, include_tree=True)
    summary = summarize_tree(view.tree["tree"] if view.tree else None)
    print(
        f"operator tree summary of the calculator: {summary.count(chr(10)) + 1} lines, {len(summary)} characters "
        f"(the tree as JSON: {len(json.dumps(view.tree))} characters)"
    )
    for label, tool, parameters, note in cases:
        samples = []
        for i in range(iterations + 3):
            started = time.perf_counter()
            await _call(dispatcher, tool, **parameters)
            if i >= 3:  # the first calls warm up connections and caches
                samples.append(time.perf_counter() - started)
            if tool == "click" and i % 10 == 9:
                await _call(dispatcher, "press_keys", keys="Escape")  # keep the entry short
        rows.append((label, samples, note))
    await _call(dispatcher, "press_keys", keys="Escape")
    del launched
    return rows


#: The applications of --observation: command, and what the summary must show for a typing task.
OBSERVED = {
    "gnome-calculator": ["gnome-calculator"],
    "mousepad": ["mousepad"],
    "zenity form": ["zenity", "--forms", "--title=Signup", "--add-entry=Name", "--add-entry=Email"],
    "thunar": ["thunar", "/tmp"],
}
_EDITABLE = re.compile(r"^(e[a-z2-7]{10}) (?:text|text box|entry)\b.*\beditable\b", re.M)


async def _observe(dispatcher: LocalCommandDispatcher, iterations: int) -> list[tuple[str, list[float], str]]:
    rows = []
    for label, command in OBSERVED.items():
        await _call(dispatcher, "launch", command=command, wait=60)
        samples = []
        summary = ""
        for i in range(iterations + 3):
            started = time.perf_counter()
            view = await look(
                dispatcher,
                f"bench-{i % 5}",
                save_tree=False,
                include_tree=True,
                tree_parameters={"max_nodes": 300, "on_screen": True},
            )
            if view.errors or view.tree is None:
                raise SystemExit(f"look at {label} failed: {view.errors}")
            summary = summarize_tree(view.tree["tree"], screen=(view.screenshot or {}).get("screen"))
            if i >= 3:
                samples.append(time.perf_counter() - started)
        found = _EDITABLE.search(summary)
        where = (
            f"editable text at line {summary[: found.end()].count(chr(10)) + 1}, after {found.start()} characters"
            if found
            else "NO editable text in the summary"
        )
        note = f"{view.tree['node_count']} nodes; summary {summary.count(chr(10)) + 1} lines, {len(summary)} chars; {where}"
        rows.append((f"observation: {label}", samples, note))
        await _call(dispatcher, "press_keys", keys="Escape")
    return rows


async def _run(
    iterations: int, in_process: bool, artifacts: Path, observation: bool = False
) -> list[tuple[str, list[float], str]]:
    if in_process:
        desktop = Desktop(DesktopOptions(artifacts=artifacts))
        dispatcher = LocalCommandDispatcher.from_servers({"desktop": build_server(desktop)}, assume_yes=True)
    else:
        desktop = None
        config = default_servers(artifacts, desktop=DesktopServer(artifacts=artifacts))["desktop"]
        dispatcher = LocalCommandDispatcher.from_config({"desktop": config}, assume_yes=True)
    try:
        async with dispatcher:
            return await (_observe if observation else _measure)(dispatcher, iterations)
    finally:
        if desktop is not None:
            await desktop.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30, help="timed calls per case (default 30)")
    parser.add_argument("--in-process", action="store_true", help="build the server in this process (no stdio hop)")
    parser.add_argument(
        "--observation",
        action="store_true",
        help="time the operator's look + tree summary on four applications instead",
    )
    args = parser.parse_args()
    programs = {"gnome-calculator": "gnome-calculator"}
    if args.observation:
        programs.update(mousepad="mousepad", zenity="zenity", thunar="thunar")
    missing = missing_packages(programs)
    if missing:
        raise SystemExit(f"needs the Debian packages {', '.join(missing)}: apt-get install -y {' '.join(missing)}")
    with VirtualDesktop(private_home=True) as virtual, tempfile.TemporaryDirectory() as scratch:
        os.environ.pop("AT_SPI_BUS_ADDRESS", None)
        os.environ.update(virtual.env)
        rows = asyncio.run(_run(args.iterations, args.in_process, Path(scratch), args.observation))
    where = "in-process server" if args.in_process else "stdio server through the dispatcher"
    apps = ", ".join(OBSERVED) if args.observation else "gnome-calculator (GTK 4)"
    print(
        f"python {sys.version.split()[0]}, Xvfb 1280x800x24, {apps}, {where}, "
        f"{args.iterations} calls per case, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    width = max(len(label) for label, _, _ in rows)
    print(f"{'call'.ljust(width)}  {'p50 ms':>8}  {'p99 ms':>8}  note")
    for label, samples, note in rows:
        print(
            f"{label.ljust(width)}  {_percentile(samples, 0.5) * 1000:8.1f}  {_percentile(samples, 0.99) * 1000:8.1f}  {note}"
        )


if __name__ == "__main__":
    main()
