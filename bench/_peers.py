"""Peer workloads for ``bench/context_store.py``: LangGraph's ``SqliteSaver``.

The same two 1,000-step loops as saucer's (bench/README.md, "How the peers are measured"):
``const`` keeps state ``{i: int}``; ``grow`` also appends a 100-character
string to a list every step (LangGraph's ``operator.add`` reducer).

Importable (``langgraph_available()``, ``run_langgraph(...)``), or run as a
script by another interpreter that has LangGraph installed::

    /path/to/peers/bin/python bench/_peers.py langgraph grow sync DIR 1000

which prints one JSON object.
"""

from __future__ import annotations

import json
import operator
import os
import sqlite3
import sys
import time
from typing import Annotated, Any, TypedDict

PAYLOAD = "x" * 100


def langgraph_available() -> bool:
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
        import langgraph.graph  # noqa: F401
    except ImportError:
        return False
    return True


def langgraph_version() -> str:
    from importlib.metadata import version

    return f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}"


class _Const(TypedDict):
    i: int


class _Grow(TypedDict):
    i: int
    log: Annotated[list, operator.add]


def _build(variant: str, checkpointer: Any, steps: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    if variant == "const":
        graph = StateGraph(_Const)
        graph.add_node("step", lambda s: {"i": s["i"] + 1})
    else:
        graph = StateGraph(_Grow)
        graph.add_node("step", lambda s: {"i": s["i"] + 1, "log": [PAYLOAD]})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda s: "step" if s["i"] < steps else END)
    return graph.compile(checkpointer=checkpointer)


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(path + s) for s in ("", "-wal", "-shm") if os.path.exists(path + s))


def run_langgraph(variant: str, durability: str, directory: str, steps: int) -> dict[str, float]:
    """Run one loop through ``SqliteSaver`` on a file in ``directory``.

    Returns ms per step, bytes on disk after closing, and the time to open
    the latest state from a new connection (ms).
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = os.path.join(directory, f"langgraph-{variant}-{durability}.sqlite")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    config = {"configurable": {"thread_id": "t1"}, "recursion_limit": steps + 10}
    init = {"i": 0} if variant == "const" else {"i": 0, "log": []}
    conn = sqlite3.connect(path, check_same_thread=False)
    app = _build(variant, SqliteSaver(conn), steps)
    started = time.perf_counter()
    out = app.invoke(init, config, durability=durability)
    elapsed = time.perf_counter() - started
    assert out["i"] == steps
    conn.close()
    size = _disk_bytes(path)
    started = time.perf_counter()
    conn = sqlite3.connect(path, check_same_thread=False)
    state = _build(variant, SqliteSaver(conn), steps).get_state(config)
    opened = time.perf_counter() - started
    assert state.values["i"] == steps
    conn.close()
    os.remove(path)
    return {"ms_per_step": elapsed / steps * 1e3, "disk_bytes": size, "open_ms": opened * 1e3}


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "langgraph":
        sys.exit("usage: _peers.py langgraph const|grow sync|exit DIR STEPS")
    if not langgraph_available():
        print(json.dumps({"error": "not installed: pip install saucer[bench]"}))
        sys.exit(0)
    result = run_langgraph(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    result["version"] = langgraph_version()  # type: ignore[assignment]
    print(json.dumps(result))
