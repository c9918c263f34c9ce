"""The Context on top of every store backend (memory, SQLite, PostgreSQL), through ``Context.open(store_url)``.

(The store's own contract, :mod:`saucer.store.testing`, knows nothing of the
Context: it runs in ``test_contract.py``.)
"""

from __future__ import annotations

import pytest

from saucer.context import Context, ContextNames
from saucer.store import ConflictError

N = ContextNames


def test_context_commit_and_hydrate(store_url: str) -> None:
    ctx = Context.open(store_url, "s", author="agent:a", snapshot_every=3)
    ctx.set(N.CURRENT_ROUND_ID, 2)
    ctx.current_round_cost += 0.5
    ctx.add_to_structural_logs({"Round": 2, "SubtaskIndex": 1, "Action": "click"})
    ctx.update_vars(set={"status": "ok", "t": (1, 2)})
    assert ctx.commit() == 1
    for i in range(5):
        with ctx.step(step=i):
            ctx.incr("n")
            ctx.append(N.PREVIOUS_SUBTASKS, f"task {i}")
    expected = ctx.to_dict()
    other = Context.open(store_url, "s")  # another client, before close: snapshot + tail
    assert other.version == 6 and other.to_dict() == expected
    ctx.close()
    again = Context.open(store_url, "s")
    assert again.to_dict() == expected
    assert again.get(N.ROUND_COST) == {2: 0.5} and again.filter_structural_logs(2, 1, "Action") == ["click"]
    assert again.get_var("t") == [1, 2]
    assert [e.author for e in again.history("n")] == ["agent:a"] * 5
    assert [e.step for e in again.history("n")] == [0, 1, 2, 3, 4]
    old = Context.open(store_url, "s", at=1)
    assert old.get_var("n") is None and old.read_only
    other.close()
    again.close()


def test_context_fork_and_history(store_url: str) -> None:
    ctx = Context.open(store_url, "p")
    for i in range(4):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    child = ctx.fork("c", at=2)
    assert child.get_var("i") == 1
    child.update_vars(set={"i": "child"})
    child.commit()
    ctx.close()
    child.close()
    reopened = Context.open(store_url, "c")
    assert reopened.get_var("i") == "child" and reopened.version == 3
    assert [(e.session_id, e.version) for e in reopened.history("i")] == [("p", 1), ("p", 2), ("c", 3)]
    assert Context.open(store_url, "p").get_var("i") == 3
    assert reopened.diff(2, 3) == {"vars.i": {"before": 1, "after": "child"}}
    reopened.close()


def test_context_conflicts_and_rebase(store_url: str) -> None:
    a = Context.open(store_url, "s")
    b = Context.open(store_url, "s")
    a.update_vars(set={"owner": "a"})
    a.incr("n")
    a.commit()
    b.incr("n")
    b.append("l", "b")
    assert b.commit() == 2 and b.get_var("n") == 2  # atomic only: re-based
    a.update_vars(set={"owner": "a2"})
    with pytest.raises(ConflictError, match=r"keys: vars\.n, vars\.l\)") as info:  # what b changed
        a.commit()
    assert "vars.owner" not in str(info.value)
    a.reload()
    assert a.version == 2 and a.get_var("l") == ["b"]
    a.update_vars(set={"owner": "a2"})
    assert a.commit() == 3
    a.close()
    b.close()
