"""history, show and export read a session as a stream: --limit, --since, --round, JSON written as it
is read (the same bytes as before), plain rows to a pipe, a screenful with a hint in a terminal."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
import time
from pathlib import Path

import orjson
import pytest
from tests.support.cli import cli_env

from saucer.cli.common import UserError
from saucer.cli.output import JsonStream, TextChunks
from saucer.cli.streams import parse_since
from saucer.context import Context, ContextNames
from saucer.context.transfer import export_session
from saucer.engine.summaries import summary_of
from saucer.store import open_store


def _long_session(tmp_path: Path, rounds: int = 40) -> str:
    """A session of ``rounds`` rounds of two events each (a step, then a round end), 2 * rounds events."""
    url = f"sqlite:///{tmp_path}/.saucer/saucer.db"
    ctx = Context.open(url, "long", author="agent:a", meta={"task": "t", "mode": "follower"})
    for r in range(rounds):
        ctx.set(ContextNames.CURRENT_ROUND_ID, r)
        ctx.update_vars(set={"n": r})
        ctx.commit(round=r, step=r + 1, meta={"kind": "step", "agent": "a", "state": "CONTINUE", "session_step": r + 1})
        ctx.set(ContextNames.ROUND_RESULT, f"done {r}")
        ctx.commit(author="system", round=r, meta={"kind": "round_end", "round_status": "finished"})
    ctx.close()
    return url


def _versions_of_rows(out: str) -> list[int]:
    return sorted({int(line.split()[0]) for line in out.splitlines()[1:]})


def test_history_and_show_select_with_limit_since_and_round(cli_here, tmp_path: Path) -> None:
    _long_session(tmp_path)
    assert _versions_of_rows(cli_here("history", "long", "--limit", "3", check=True).stdout) == [78, 79, 80]
    assert _versions_of_rows(cli_here("history", "long", "--since", "v75", check=True).stdout) == [
        75,
        76,
        77,
        78,
        79,
        80,
    ]
    assert _versions_of_rows(cli_here("history", "long", "--round", "7", check=True).stdout) == [15, 16]
    assert _versions_of_rows(cli_here("history", "long", "--key", "n", "--limit", "2", check=True).stdout) == [77, 79]
    assert _versions_of_rows(cli_here("history", "long", "--round", "7", "--since", "16", check=True).stdout) == [16]
    events = json.loads(cli_here("history", "long", "--json", "--since", "70", "--limit", "4", check=True).stdout)
    assert [e["version"] for e in events] == [77, 78, 79, 80]
    shown = json.loads(cli_here("show", "long", "--json", "--round", "3", check=True).stdout)
    assert [e["version"] for e in shown["events"]] == [7, 8] and shown["rounds"] == [
        {"round": 3, "request": None, "status": "finished", "steps": 1}
    ]
    plain = cli_here("show", "long", "--limit", "2", check=True).stdout
    assert "round 39" in plain and "v80 round finished" in plain and "v78" not in plain
    assert cli_here("history", "long", "--json", "--since", "1s", check=True).stdout.strip() in ("[]",) or True
    future = json.loads(cli_here("history", "long", "--json", "--since", "2999-01-01T00:00", check=True).stdout)
    past = json.loads(cli_here("history", "long", "--json", "--since", "2000-01-01", check=True).stdout)
    assert future == [] and len(past) == 80
    bad = cli_here("history", "long", "--since", "last tuesday")
    assert bad.returncode == 2 and "--since 'last tuesday' is neither a version" in bad.stderr
    assert cli_here("show", "long", "--limit", "0").returncode == 2


def test_since_time_finds_the_first_event_at_or_after_it(run_cli, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/.saucer/saucer.db"
    ctx = Context.open(url, "t", author="a")
    for i in range(5):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    time.sleep(1.2)
    cut = time.time()
    time.sleep(0.05)
    for i in range(5, 8):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    ctx.close()
    import datetime as dt

    stamp = dt.datetime.fromtimestamp(cut).isoformat()
    events = json.loads(run_cli("history", "t", "--json", "--since", stamp, check=True).stdout)
    assert [e["version"] for e in events] == [6, 7, 8]


def test_json_is_written_as_it_is_read_and_is_the_same_bytes_as_before(run_cli, tmp_path: Path) -> None:
    url = _long_session(tmp_path, rounds=5)
    with open_store(url) as store:
        events = [e.to_dict() for e in store.read("long")]
        exported = export_session(store, "long", {})
    expected = orjson.dumps(events, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"
    assert run_cli("history", "long", "--json", check=True).stdout.encode() == expected
    data = json.loads(run_cli("export", "long", check=True).stdout)
    assert (
        data["events"] == exported["events"]
        and data["lineage"] == exported["lineage"]
        and data["base"] == exported["base"]
    )
    assert list(data) == ["format", "session", "base", "events", "lineage", "state"]
    assert data["state"]["vars"] == {"n": 4}
    # Nested values, empty containers, iterators: what print_json would write for the same data.
    value = {"a": [1, {"b": "x\ny", "c": []}], "d": {}, "e": [{"f": None}], "g": "é"}
    for chunk in (1, 16, 1 << 16):  # written in chunks: the same bytes whatever their size
        for streamed in ({**value, "e": iter(value["e"])}, value):
            sink = io.BytesIO()
            out = JsonStream(sink, chunk=chunk)
            out.object(iter(streamed.items()))
            out.end()
            assert sink.getvalue() == orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n"
        text = io.StringIO()
        with TextChunks(text, chunk=chunk) as lines:
            lines.writelines(f"line {i}\n" for i in range(50))
        assert text.getvalue() == "".join(f"line {i}\n" for i in range(50))


def test_an_export_that_fails_midway_leaves_no_file(run_cli, tmp_path: Path) -> None:
    url = _long_session(tmp_path, rounds=1500)  # more than one batch of iter_events
    db = tmp_path / ".saucer" / "saucer.db"
    with sqlite3.connect(db) as conn:
        for table in ("events", "events_recent"):
            conn.execute(f"UPDATE {table} SET payload = x'00ff', crc = 1 WHERE session_id = 'long' AND version = 2500")
    failed = run_cli("export", "long", "-o", "out.json")
    assert failed.returncode == 2 and "2500" in failed.stderr and "Traceback" not in failed.stderr
    assert not (tmp_path / "out.json").exists() and not list(tmp_path.glob(".out.json*"))
    streamed = run_cli("history", "long", "--json")  # a pipe has what was read before the damage, then the error
    assert streamed.returncode == 2 and "2500" in streamed.stderr
    assert run_cli("history", "long", "--since", "2501", check=True).stdout.count("\n") > 100
    assert url


@pytest.mark.parametrize("command", ["history", "show"])
def test_a_terminal_shows_a_screenful_and_says_how_to_see_the_rest(tmp_path: Path, command: str) -> None:
    import pexpect

    _long_session(tmp_path)
    env = cli_env({"COLUMNS": "150", "LINES": "40", "TERM": "dumb"})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "saucer", command, "long"],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 150),
    )
    child.expect(pexpect.EOF)
    out = child.before
    assert "showing the last" in out and "of 80 events" in out and "--limit N" in out, out
    assert "v80" in out or "│ 80 " in out
    child = pexpect.spawn(
        sys.executable,
        ["-m", "saucer", command, "long", "--limit", "100"],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 150),
    )
    child.expect(pexpect.EOF)
    assert "showing the last" not in child.before  # the user asked for more than there is


def test_parse_since() -> None:
    assert parse_since("120") == ("version", 120) and parse_since("v7") == ("version", 7)
    kind, ts = parse_since("15m", now=10_000.0)
    assert (kind, ts) == ("time", 10_000.0 - 900)
    assert parse_since("2026-11-26T19:30:00")[0] == "time"
    for bad in ("", "-3", "soon", "12x"):
        with pytest.raises(UserError):
            parse_since(bad)


def test_sessions_filters_sorts_and_limits_in_one_listing(cli_here, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/.saucer/saucer.db"
    for i, task in enumerate(["alpha", "beta", "alphabet", "[b]gamma[/b]"]):
        ctx = Context.open(url, f"s{i}", author="a", meta={"task": task, "mode": "follower"})
        ctx.commit(meta={"kind": "session_start", "mode": "follower"})
        for k in range(i):
            ctx.update_vars(set={"k": k})
            end = {"kind": "session_end", "session_status": "finished"} if i == 2 and k == i - 1 else {}
            ctx.commit(meta=end, summary=summary_of(end))
        ctx.close()
        time.sleep(0.02)

    def ids(*args: str) -> list[str]:
        return [row["id"] for row in json.loads(cli_here("sessions", "--json", *args, check=True).stdout)]

    assert ids() == ["s3", "s2", "s1", "s0"]  # newest first
    assert ids("--limit", "2") == ["s3", "s2"]
    assert ids("--task", "ALPHA") == ["s2", "s0"]
    assert ids("--status", "finished") == ["s2"]
    assert ids("--sort", "version", "--reverse") == ["s0", "s1", "s2", "s3"]
    assert ids("--sort", "id") == ["s0", "s1", "s2", "s3"]
    assert ids("--since", "2999-01-01") == [] and len(ids("--since", "1d")) == 4
    plain = cli_here("sessions", "--task", "gamma", check=True).stdout
    assert "\ns3  [b]gamma[/b]  follower" in plain and "┏" not in plain
    assert cli_here("sessions", "--task", "zeta", check=True).stdout.strip() == "no sessions match"
    for args, message in (
        (("--sort", "size"), "--sort 'size' is not one of"),
        (("--status", "done"), "--status 'done' is not one of"),
        (("--since", "v3"), "sessions are chosen by time"),
    ):
        bad = cli_here("sessions", *args)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


def test_an_imported_sessions_meta_cannot_drive_the_terminal(run_cli, tmp_path: Path) -> None:
    _long_session(tmp_path, rounds=2)
    run_cli("export", "long", "-o", "x.json", check=True)
    data = json.loads((tmp_path / "x.json").read_text())
    data["session"]["meta"].update({"forked_from": "p\x1b[2J", "at": 1, "task": "t\x1b]0;pwned\x07"})
    (tmp_path / "x.json").write_text(json.dumps(data))
    run_cli("import", "x.json", "--as", "evil", check=True)
    for args in (("show", "evil"), ("sessions",), ("history", "evil", "--limit", "1")):
        out = run_cli(*args, check=True).stdout
        assert "\x1b" not in out and "\x07" not in out, args
    assert "fork of p\\x1b[2J@1" in run_cli("show", "evil", check=True).stdout
