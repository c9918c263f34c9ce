"""Stored history through the command line: prune and forks, export/import, and store errors as one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

from saucer.context import Context


def _db(cwd: Path) -> str:
    return f"sqlite:///{cwd}/.saucer/saucer.db"


def _one_line_error(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _session(cwd: Path, sid: str, n: int) -> Context:
    ctx = Context.open(_db(cwd), sid, author="writer")
    for i in range(1, n + 1):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    return ctx


def test_prune_keeps_every_fork_readable(cli_here, tmp_path: Path) -> None:
    _session(tmp_path, "A", 10).close()
    cli_here("fork", "A", "--at", "6", "--as", "B", check=True)
    cli_here("fork", "B", "--at", "4", "--as", "C", check=True)
    before = {
        (sid, v): cli_here("state", sid, "--at", str(v), "--json", check=True).stdout for sid, v in [("B", 2), ("C", 3)]
    }
    history = cli_here("history", "C", "--json", check=True).stdout
    out = cli_here("store", "prune", "A", "--keep-last", "2", check=True).stdout
    assert "versions before 8 dropped (v8..v10 remain)" in out
    assert "fork B now holds its own copy of the history it reads (up to v6)" in out
    for (sid, v), shown in before.items():
        assert cli_here("state", sid, "--at", str(v), "--json", check=True).stdout == shown
    assert json.loads(before[("B", 2)])["vars"] == {"i": 2}
    assert json.loads(cli_here("diff", "B", "2", "6", "--json", check=True).stdout) == {
        "vars.i": {"before": 2, "after": 6}
    }
    assert cli_here("history", "C", "--json", check=True).stdout == history
    assert "(fork of A@6)" in cli_here("sessions", check=True).stdout
    # A version that is gone is an error naming the first readable one, never an empty state.
    _one_line_error(cli_here("state", "A", "--at", "2"), "version 2 was pruned", "first readable version is 8")
    _one_line_error(cli_here("diff", "A", "3", "9"), "first readable version is 8")
    _one_line_error(cli_here("fork", "A", "--at", "5"), "first readable version is 8")


def test_export_and_import_a_pruned_session(run_cli, tmp_path: Path) -> None:
    _session(tmp_path, "A", 10).close()
    run_cli("store", "prune", "A", "--keep-last", "3", check=True)
    run_cli("export", "A", "-o", "a.json", check=True)
    run_cli("import", "a.json", "--as", "A2", check=True)
    for v in (7, 10):
        original = json.loads(run_cli("state", "A", "--at", str(v), "--json", check=True).stdout)
        copy = json.loads(run_cli("state", "A2", "--at", str(v), "--json", check=True).stdout)
        assert copy["vars"] == original["vars"] == {"i": v}
    _one_line_error(run_cli("state", "A2", "--at", "6"), "first readable version is 7")


def test_an_import_that_fails_half_way_writes_nothing(run_cli, tmp_path: Path) -> None:
    _session(tmp_path, "A", 4).close()
    run_cli("export", "A", "-o", "a.json", check=True)
    data = json.loads((tmp_path / "a.json").read_text())
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    data["events"][2]["ops"].append({"op": "set", "var": "deep", "value": deep})
    (tmp_path / "bad.json").write_text(json.dumps(data))
    _one_line_error(run_cli("import", "bad.json", "--as", "B"), "events[2].ops[1].value", "nest more than 100 levels")
    _one_line_error(run_cli("state", "B"), "no session 'B'")
    (tmp_path / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    _one_line_error(run_cli("import", "nested.json"), "nests too deeply")
    _one_line_error(run_cli("import", "a.json", "--as", "bad id"), "session id 'bad id' is not valid")
    _one_line_error(run_cli("fork", "A", "--as", "x" * 300), "is not valid (it has 300 characters)")


def test_a_file_that_is_not_a_database_is_one_line(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database\n" * 500)
    for args in (
        ("sessions",),
        ("show", "s"),
        ("state", "s"),
        ("import", "x.json"),
        ("store", "prune", "--all", "--keep-last", "1"),
    ):
        (tmp_path / "x.json").write_text("{}")
        proc = run_cli(*args, "--store", f"sqlite:///{path}")
        _one_line_error(proc, str(path), "file is not a database", f'sqlite3 {path} "PRAGMA integrity_check"')


def test_a_database_with_damaged_pages_is_one_line(run_cli, tmp_path: Path) -> None:
    for i in range(20):
        _session(tmp_path, f"s{i}", 15).close()
    path = tmp_path / ".saucer" / "saucer.db"
    page = 4096  # SQLite's default
    size = path.stat().st_size // page
    with open(path, "r+b") as f:
        for number in range(1, size):
            f.seek(number * page)
            f.write(os.urandom(page))
    for args in (("sessions",), ("show", "s3"), ("history", "s3")):  # the store as the user named it
        _one_line_error(
            run_cli(*args),
            "SQLite file .saucer/saucer.db",
            "malformed",
            'sqlite3 .saucer/saucer.db "PRAGMA integrity_check"',
        )
