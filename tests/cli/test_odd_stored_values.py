"""Odd stored values (issue 27, item 3): an import is held to the limits of live values, and the
listings never crash on a value that got into a store anyway (an import made before the check)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from starlette.testclient import TestClient

from saucer.context import Context
from saucer.store import open_store
from saucer.store.model import Event, SessionInfo
from saucer.ui import create_app

FAR = 1e300


def _odd_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as store:
        ctx = Context.open(store, "fine")
        ctx.update_vars({"x": 1})
        ctx.commit()
        ctx.close()
        ops = [{"op": "set", "name": "REQUEST", "value": "hello"}, {"op": "set", "var": "x", "value": 2}]
        store.import_log(
            SessionInfo("odd", 1, FAR, FAR, None, None, {"task": "odd"}),
            [Event("odd", 1, FAR, "user", 1, 1, ops, {})],
            [],
        )
    return url


def test_a_far_timestamp_in_the_store_breaks_no_listing(tmp_path: Path, run_cli: Callable[..., object]) -> None:
    url = _odd_store(tmp_path)
    env = {"SAUCER_STORE__URL": url}
    for args in (["sessions"], ["sessions", "--json"], ["history", "odd"], ["show", "odd"], ["state", "odd"]):
        done = run_cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr[-800:])  # type: ignore[attr-defined]
        assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr  # type: ignore[attr-defined]
    listing = run_cli("sessions", env=env)
    assert "odd" in listing.stdout and "fine" in listing.stdout and "1e+300" in listing.stdout  # type: ignore[attr-defined]
    with open_store(url) as store:
        client = TestClient(create_app(store))
        for path in ("/sessions", "/sessions/odd", "/sessions/odd/history?key=REQUEST"):
            page = client.get(path)
            assert page.status_code == 200, (path, page.text[-500:])
        assert "not a valid time" in client.get("/sessions").text


def test_an_import_with_a_far_timestamp_is_refused_in_one_line(tmp_path: Path, run_cli: Callable[..., object]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as store:
        ctx = Context.open(store, "src")
        ctx.update_vars({"x": 1})
        ctx.commit()
        ctx.close()
    env = {"SAUCER_STORE__URL": url}
    run_cli("export", "src", "-o", "e.json", env=env, check=True)
    data = json.loads((tmp_path / "e.json").read_text())
    data["events"][0]["timestamp"] = FAR
    data["session"]["session_id"] = "far"
    (tmp_path / "far.json").write_text(json.dumps(data))
    done = run_cli("import", "far.json", env=env)
    assert done.returncode != 0  # type: ignore[attr-defined]
    assert done.stderr.strip().count("\n") == 0 and "events[0].timestamp" in done.stderr  # type: ignore[attr-defined]
    assert "between 1970 and 9999" in done.stderr  # type: ignore[attr-defined]
    assert "far" not in run_cli("sessions", env=env).stdout  # type: ignore[attr-defined]
