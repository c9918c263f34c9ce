"""The sessions of the golden stores: what ``make_golden.py`` writes into each store.

Everything goes through saucer's public API (``Context``, ``saucer.context.prune``,
the store's ``acquire_lease``, ``saucer run --plan``), except the damage done to
two records, which no API can do (see ``damaged``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import golden_format as gf

from saucer.context import Context, prune
from saucer.context import ContextNames as N
from saucer.context.names import WeavingMode
from saucer.store import EventStore, open_store

Damage = Callable[[str, int], None]
#: What the damaged records are overwritten with: a torn JSON payload.
TORN = b'{"ops": [{"op": "set", "var": "n", "val'


class Recorder:
    """The live state of each session right after each of its commits (to check reads against)."""

    def __init__(self) -> None:
        self.live: dict[str, dict[int, dict[str, Any]]] = {}

    def record(self, ctx: Context) -> int:
        if not ctx.pending:
            self.live.setdefault(ctx.session_id, {})[ctx.version] = gf.flat_state(ctx)
        return ctx.version

    def commit(self, ctx: Context, **kw: Any) -> int:
        ctx.commit(**kw)
        return self.record(ctx)


# ------------------------------------------------------------ API sessions


def typed_names(store: EventStore, rec: Recorder) -> None:
    """Every durable ContextNames type, written through UFO's API, over several rounds."""
    ctx = Context.open(
        store, "names-all", author="agent:host", meta={"task": "every ContextNames type", "mode": "normal"}
    )
    ctx.update_dict(
        {N.ID: 7, N.MODE: "follower", N.CURRENT_ROUND_ID: 0, N.REQUEST: "Résumé – 東京 📎 «tidy» the notes"}
    )
    ctx.set(N.SUBTASK, "open the notes")
    rec.commit(ctx, round=0, step=1)
    ctx.current_round_cost += 0.1
    ctx.current_round_cost += 0.2
    ctx.current_round_step = 3
    ctx.current_round_subtask_amount = 2
    ctx.set(N.SESSION_COST, 0.30000000000000004)
    ctx.set(N.SESSION_STEP, 3)
    ctx.set(N.PREVIOUS_SUBTASKS, ["open the notes", ("a tuple", 1)])
    ctx.set(N.HOST_MESSAGE, [{"to": "app", "text": "héllo\nworld"}])
    rec.commit(ctx, round=0, step=2)
    ctx.set(N.CURRENT_ROUND_ID, 1)
    ctx.set(N.CURRENT_ROUND_COST, 2)  # an int for a float name: stored as 2.0
    ctx.update_dict(N.ROUND_STEP, {1: 4, 5: 0})
    ctx.update_dict(N.ROUND_SUBTASK_AMOUNT, {"7": 1})  # a round id given as its decimal string
    ctx.set(N.ROUND_RESULT, "round 0 done")
    ctx.add_to_structural_logs({"Round": 0, "SubtaskIndex": 0, "Action": "open", "Args": {"path": "notes.md"}})
    ctx.add_to_structural_logs({"Round": 0, "SubtaskIndex": 1, "Action": "read", "Cost": 0.5})
    ctx.add_to_structural_logs({"Round": 1, "SubtaskIndex": 0, "Action": "write", "Nested": {"a": [1, {"b": None}]}})
    ctx.add_to_structural_logs({"Round": 1, "Action": "ignored: no SubtaskIndex"})
    rec.commit(ctx, author="agent:app", round=1, step=1)
    ctx.set(
        N.APPLICATION_WINDOW_INFO,
        {
            "title": "Notes — Draft",
            "rect": [0, 0, 1920.5, 1080],
            "pid": 4242,
            "ok": True,
            "nested": {"list": [1, "two", 3.0, None], "empty": {}},
        },
    )
    ctx.set(N.APPLICATION_PROCESS_NAME, "notepad.exe")
    ctx.set(N.APPLICATION_ROOT_NAME, "Notes")
    ctx.set(N.CONTROL_REANNOTATION, [{"id": 3, "label": "Save"}])
    ctx.set(N.LOG_PATH, "logs/golden/names-all")
    ctx.set(N.TOOL_INFO, {"files.read": {"server": "files", "description": "read a file"}})
    ctx.set(N.DEVICE_INFO, [{"device_id": "laptop", "os": "linux", "tags": ["a", "b"]}])
    ctx.set(N.WEAVING_MODE, WeavingMode.EDITING)
    ctx.set(N.LOGGER, None)  # runtime-only: never stored
    rec.commit(ctx, round=1, step=2)
    ctx.set(N.STRUCTURAL_LOGS, {2: {0: [{"Action": "replaced"}], 3: []}, 1: {0: [{"Action": "kept"}]}})
    ctx.add_to_structural_logs({"Round": 2, "SubtaskIndex": 3, "Action": "after the replace"})
    ctx.set(N.APPLICATION_WINDOW_INFO, [1, "two", 3.0])
    ctx.set(N.WEAVING_MODE, "creation")
    ctx.update_dict(N.TOOL_INFO, {"shell.run": {"server": "shell"}})
    ctx.append(N.PREVIOUS_SUBTASKS, {"subtask": "read", "status": "finished"})
    rec.commit(ctx, round=1, step=3)
    ctx.update_dict({N.CURRENT_ROUND_ID: 2**40, N.CURRENT_ROUND_COST: 0.5, N.ROUND_RESULT: "big round id"})
    ctx.current_round_step += 1
    ctx.set(N.APPLICATION_WINDOW_INFO, "just a string")
    rec.commit(ctx, round=2**40)
    ctx.set(N.CURRENT_ROUND_ID, -1)
    ctx.current_round_subtask_amount = 9
    ctx.set(N.APPLICATION_WINDOW_INFO, None)
    ctx.set(N.MODE, "")
    rec.commit(ctx, round=-1, step=0)
    ctx.close()


def free_vars(store: EventStore, rec: Recorder) -> None:
    """AG2-style context variables: odd keys and values, set and delete in one change."""
    ctx = Context.open(store, "vars-mix", author="user:alice")
    ctx.update_vars(
        set={
            "status": "planning",
            "draft": "to be deleted",
            "ключ": "значение",
            "键": "值",
            "emoji😀": "🚀✨",
            "a.b": "a dot",
            "vars.x": "looks like a prefix",
            "$dollar": {"$inner": 1, "plain": 2},
            "int_max": 2**63 - 1,
            "int_min": -(2**63),
            "zero": 0,
            "floats": [0.1, -0.0, 5e-324, 1.7976931348623157e308, 1e16, 2.5],
            "bools": [True, False],
            "none": None,
            "empty_str": "",
            "empty_list": [],
            "empty_dict": {},
            "control": "line\nbreak\ttab\u0000nul\u001f\u007f",
            "combining": "e\u0301 Å \u200f rtl \u05e9\u05dc\u05d5\u05dd",
            "long": "x" * 2000,
            "deep": _deep(30),
        }
    )
    rec.commit(ctx)
    ctx.update_vars(set={"status": "running", "draft": "set again after the delete"}, delete=["draft", "zero"])
    rec.commit(ctx, author="agent:planner", round=0, step=1, meta={"why": "delete first, then set", "ünï": ["cödé"]})
    ctx.delete_var("none")
    ctx.delete_var("never-set")
    ctx.update_vars(set={"nested": {"a": {"b": {"c": [1, 2, {"d": "e"}]}}}, "tuple": (1, (2, 3))})
    rec.commit(ctx, author="tool:files", round=0, step=2)
    rec.commit(ctx, author="system", meta={"kind": "note", "text": "an event with no operations"})
    ctx.update_vars(set={"status": "done"})
    rec.commit(ctx, author="user:bob ünïcode", round=1, step=None)
    ctx.close()


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for i in range(depth):
        value = [value] if i % 2 else {"level": value}
    return value


def atomic_ops(store: EventStore, rec: Recorder) -> None:
    """incr, append and compare-and-set on vars and typed names; a concurrent incr that is re-based."""
    ctx = Context.open(store, "atomic", author="agent:counter")
    ctx.set(N.CURRENT_ROUND_ID, 3)
    ctx.incr("n")
    ctx.incr("n", 41)
    ctx.incr("x", 0.5)
    ctx.incr(N.SESSION_STEP)
    ctx.incr(N.SESSION_COST, 0.25)
    ctx.incr(N.CURRENT_ROUND_STEP, 2)
    ctx.incr(N.CURRENT_ROUND_COST, 1)
    ctx.append("log", "first")
    ctx.append("log", {"second": [2]})
    ctx.append(N.PREVIOUS_SUBTASKS, "subtask one")
    ctx.append(N.HOST_MESSAGE, {"to": "app", "text": "go"})
    rec.commit(ctx, round=3, step=1)
    assert ctx.compare_and_set("status", None, "idle")
    assert not ctx.compare_and_set("status", "busy", "never")
    assert ctx.compare_and_set(N.SESSION_COST, 0.25, 1)
    assert ctx.compare_and_set(N.WEAVING_MODE, WeavingMode.CREATION, WeavingMode.EDITING)
    assert ctx.compare_and_set(N.CURRENT_ROUND_SUBTASK_AMOUNT, 0, 4)
    rec.commit(ctx, round=3, step=2)
    other = Context.open(store, "atomic", author="agent:other")
    other.incr("n", 100)
    other.append("log", "from the other writer")
    rec.commit(other, round=3, step=3)
    ctx.incr("n", -2)  # based on a stale version: re-based on commit, nothing lost
    ctx.append("log", "re-based")
    assert ctx.compare_and_set("status", "idle", "busy")
    rec.commit(ctx, round=3, step=4)
    other.close()
    ctx.close()


def durability_modes(store: EventStore, rec: Recorder) -> None:
    """strict (an event per change), step (Context.step blocks, one failing) and exit (one event at close)."""
    strict = Context.open(store, "durability-strict", durability="strict", author="agent:strict")
    strict.set(N.REQUEST, "each change is an event")
    rec.record(strict)
    strict.update_vars(set={"a": 1})
    rec.record(strict)
    strict.incr("a")
    rec.record(strict)
    strict.close()

    stepped = Context.open(store, "durability-step", author="agent:host")
    with stepped.step(author="agent:host", round=1, step=1, meta={"agent": "host", "state": "CONTINUE"}):
        stepped.set(N.SUBTASK, "first step")
        stepped.update_vars(set={"done": ["first"]})
    rec.record(stepped)
    try:
        with stepped.step(round=1, step=2):
            stepped.set(N.SUBTASK, "a step that fails: discarded")
            raise RuntimeError("the step failed")
    except RuntimeError:
        pass
    with stepped.step(author="agent:app", round=1, step=3):
        stepped.append("done", "third")
    rec.record(stepped)
    stepped.close()

    exit_ctx = Context.open(store, "durability-exit", durability="exit", author="agent:batch")
    with exit_ctx.step(round=0, step=1):
        exit_ctx.set(N.REQUEST, "committed at close")
    with exit_ctx.step(round=0, step=2):
        exit_ctx.incr("steps", 2)
    exit_ctx.close()
    rec.record(Context.open(store, "durability-exit", at=store.head("durability-exit")))


def snapshots(store: EventStore, rec: Recorder) -> None:
    """Snapshots every 3 events (all kept), an explicit one, a compressed one, and the default keep of 2."""
    ctx = Context.open(store, "snapshots", snapshot_every=3, keep_snapshots=50, author="agent:snap")
    for i in range(1, 17):
        ctx.update_vars(set={"i": i, f"k{i % 4}": [i] * i})
        ctx.set(N.SESSION_STEP, i)
        rec.commit(ctx, round=i // 5, step=i)
        if i == 7:
            ctx.snapshot()
    ctx.close()
    few = Context.open(store, "snapshots-keep-2", snapshot_every=2)
    for _ in range(1, 10):
        few.incr("i")
        rec.commit(few)
    few.close()
    big = Context.open(store, "big-state", snapshot_every=2)
    big.update_vars(set={"text": "".join(f"line {i}: {'abc' * (i % 7)}\n" for i in range(100))})
    rec.commit(big)
    big.set(N.TOOL_INFO, {f"tool{i}": {"description": "d" * 40, "n": i} for i in range(40)})
    rec.commit(big)
    big.update_vars(set={"after": "the compressed snapshot"})
    rec.commit(big)
    big.close()


def forks(store: EventStore, rec: Recorder) -> None:
    """A fork, a fork of that fork, a fork at version 0, and the parent going on after forking."""
    root = Context.open(store, "tree-root", author="agent:root")
    for i in range(1, 7):
        root.update_vars(set={"i": i, "who": "root"})
        rec.commit(root, round=0, step=i)
    child = root.fork("tree-child", at=3, author="agent:child")
    rec.record(child)
    for i in range(1, 4):
        child.update_vars(set={"who": "child", f"c{i}": i})
        rec.commit(child, round=1, step=i)
    grandchild = child.fork("tree-grandchild", at=5)
    rec.record(grandchild)
    grandchild.update_vars(set={"who": "grandchild"}, delete=["c1"])
    rec.commit(grandchild, author="agent:grandchild")
    grandchild.set(N.REQUEST, "a request of the grandchild")
    rec.commit(grandchild)
    empty = root.fork("tree-fork-at-0", at=0)
    empty.update_vars(set={"from": "nothing"})
    rec.commit(empty)
    root.update_vars(set={"i": 7})
    rec.commit(root)
    for c in (empty, grandchild, child, root):
        c.close()
    # Ids have been checked at creation since e64f414 (letters, digits and ._:@+-): the older labels
    # hold "sess ünï/😀 id"; a new label holds an id with every punctuation mark the rule allows.
    odd_sid = Context.open(store, "sess.id:a@b+c-1", author="user:ünï")
    odd_sid.update_vars(set={"ok": True})
    rec.commit(odd_sid)
    odd_sid.close()


def pruned(store: EventStore, rec: Recorder) -> None:
    """Sessions to prune later (one with a fork taken before the prune); one pruned twice already."""
    ctx = Context.open(store, "pruned", snapshot_every=4, author="agent:long")
    for i in range(1, 15):
        ctx.update_vars(set={"i": i}, delete=["gone"] if i == 9 else [])
        if i == 2:
            ctx.update_vars(set={"gone": "deleted at v9"})
        ctx.set(N.SESSION_STEP, i)
        rec.commit(ctx, round=i // 3, step=i)
    fork = ctx.fork("pruned-fork", at=10, author="agent:fork")
    rec.record(fork)
    fork.update_vars(set={"fork": 1})
    rec.commit(fork)
    fork.close()
    ctx.close()
    twice = Context.open(store, "pruned-twice", snapshot_every=5)
    for i in range(1, 11):
        twice.update_vars(set={"i": i, f"only{i}": i} if i < 3 else {"i": i})
        rec.commit(twice, round=1, step=i)
    assert prune(store, "pruned-twice", keep_last=6) == 4
    twice.reload()
    for i in range(11, 13):
        twice.update_vars(set={"i": i})
        rec.commit(twice, round=2, step=i)
    twice.close()


def prune_now(store: EventStore) -> None:
    assert prune(store, "pruned", keep_last=6) == 8  # the fork at 10 does not hold it back
    assert prune(store, "pruned-twice", keep_last=3) == 9


def leases(store: EventStore, rec: Recorder) -> None:
    """Commits fenced by a lease; the lease then taken over by a second worker and released."""
    store.create_session("leased", meta={"task": "leases"})
    lease = store.acquire_lease("leased", "worker-1", ttl=60)
    ctx = Context.open(store, "leased", fence=lease.token, author="worker-1")
    ctx.update_vars(set={"owner": "worker-1"})
    rec.commit(ctx)
    store.release_lease(lease)
    second = store.acquire_lease("leased", "worker-2", ttl=60)
    ctx.fence = second.token
    ctx.author = "worker-2"
    ctx.update_vars(set={"owner": "worker-2"})
    rec.commit(ctx)
    store.release_lease(second)
    ctx.close()


def damaged(store: EventStore, rec: Recorder, damage: Damage) -> None:
    """A trailing record damaged, then quarantined by a writer; and one left torn."""
    for sid in ("quarantined", "torn-tail"):
        ctx = Context.open(store, sid, snapshot_every=1000)
        for i in range(1, 6 if sid == "quarantined" else 5):
            ctx.update_vars(set={"n": i})
            rec.commit(ctx, round=0, step=i)
        # Not closed: close() would snapshot the head, and a writer would then
        # never read (and quarantine) the damaged record.
        damage(sid, ctx.version)
        rec.live[sid].pop(ctx.version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "skipping damaged trailing record at version 5"
        writer = Context.open(store, "quarantined", snapshot_every=1000)
    writer.update_vars(set={"n": 6})
    rec.commit(writer, round=0, step=6)
    writer.update_vars(set={"n": 7})
    rec.commit(writer, round=0, step=7)
    writer.close()


# ------------------------------------------------------------ engine sessions

_PLANS: dict[str, dict[str, Any]] = {
    "finished": {
        "task": "golden finished",
        "object": "notes/today.md",
        "steps": [
            {
                "subtask": "write the notes",
                "commands": [
                    {
                        "tool_name": "files.write",
                        "parameters": {"path": "notes/today.md", "content": "# Today — ünïcode ✓\n"},
                    }
                ],
            },
            {
                "subtask": "list and count",
                "commands": [
                    {"tool_name": "files.list", "parameters": {"path": "notes"}, "tool_type": "data_collection"},
                    {"tool_name": "shell.run", "parameters": {"command": "wc -c < notes/today.md"}},
                ],
            },
        ],
    },
    "failed": {
        "task": "golden failed",
        "steps": [
            {
                "subtask": "write a file",
                "commands": [{"tool_name": "files.write", "parameters": {"path": "a.txt", "content": "a"}}],
            },
            {
                "subtask": "read a missing file",
                "commands": [
                    {"tool_name": "files.read", "parameters": {"path": "missing.txt"}, "tool_type": "data_collection"}
                ],
            },
            {
                "subtask": "never reached",
                "commands": [{"tool_name": "files.write", "parameters": {"path": "b.txt", "content": "b"}}],
            },
        ],
    },
    # Step 2 kills the runner (the parent of the shell tool's server) while it runs,
    # when the workspace has a kill-runner file: the store is left mid-session.
    "interrupted": {
        "task": "golden interrupted",
        "steps": [
            {
                "subtask": "write the first file",
                "commands": [{"tool_name": "files.write", "parameters": {"path": "first.txt", "content": "1\n"}}],
            },
            {
                "subtask": "a step the runner dies in",
                "commands": [
                    {
                        "tool_name": "shell.run",
                        "parameters": {
                            "command": "if [ -f kill-runner ]; then rm -f kill-runner; kill -9 $(awk '{print $4}' /proc/$PPID/stat); fi; echo step two"
                        },
                    }
                ],
            },
            {
                "subtask": "write the last file",
                "commands": [{"tool_name": "files.write", "parameters": {"path": "last.txt", "content": "3\n"}}],
            },
        ],
    },
}


def engine_sessions(url: str, work: Path) -> dict[str, dict[str, Any]]:
    """Run the plans with ``saucer run --plan`` in ``work``; return {session id: engine info}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["SAUCER_STORE__SNAPSHOT_EVERY"] = "3"  # snapshots (with the tools' TOOL_INFO) in the middle of a run
    # The tools as stdio servers (the default since 2424ba9 is in-process): step 2 of the interrupted plan
    # kills its shell server's parent, which must be the runner, not this script.
    env["SAUCER_MCP__ISOLATE"] = "true"
    saucer = str(Path(sys.executable).with_name("saucer"))
    (work / "plans").mkdir(parents=True, exist_ok=True)
    found: dict[str, dict[str, Any]] = {}
    for kind, plan in _PLANS.items():
        plan_file = Path("plans") / f"{kind}.json"
        (work / plan_file).write_text(json.dumps(plan, ensure_ascii=False, indent=1), encoding="utf-8")
        workspace = work / f"ws-{kind}"
        workspace.mkdir()
        if kind == "interrupted":
            (workspace / "kill-runner").write_text("")
        task = f"golden-{kind}"
        proc = subprocess.run(
            [
                saucer,
                "run",
                "--plan",
                str(plan_file),
                "--store",
                url,
                "--workspace",
                workspace.name,
                "--task",
                task,
                "--yes",
            ],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        want = {"finished": 0, "failed": 1, "interrupted": -9}[kind]
        if proc.returncode != want:
            raise SystemExit(f"saucer run ({kind}) exited {proc.returncode}, not {want}:\n{proc.stdout}\n{proc.stderr}")
        with open_store(url) as store:
            (sid,) = [i.session_id for i in store.sessions() if i.meta.get("task") == task]
        found[sid] = {
            "kind": kind,
            "task": task,
            "plan_steps": len(plan["steps"]),
            "subtasks": [s["subtask"] for s in plan["steps"]],
            "exit_code": want,
        }
        print(f"  engine session {sid}: {kind} (exit {proc.returncode})")
    return found


def write_all(store: EventStore, url: str, work: Path, damage: Damage) -> tuple[Recorder, dict[str, Any]]:
    """Every session but the last prunes (:func:`prune_now`); returns the live states and the engine sessions."""
    rec = Recorder()
    engine = engine_sessions(url, work)
    for write in (typed_names, free_vars, atomic_ops, durability_modes, snapshots, forks, pruned, leases):
        write(store, rec)
    if hasattr(store, "fold_every"):
        store.fold_every = 1 << 30  # the damaged records stay in SQLite's ``events_recent``
    damaged(store, rec, damage)
    return rec, engine
