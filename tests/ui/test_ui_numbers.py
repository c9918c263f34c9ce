"""The viewer = the CLI, field by field, over sessions of every kind (invariant 16: one source for every number).

One store, made by the CLI's commands (called in this process: the subject is what they store and print): LLM sessions against the tests' fake
OpenAI server with a priced model and with a model of unknown price, plans
that finish, fail and stop at a limit, a fork not run and a fork run, a
pruned session, an imported one, an interrupted one (its runner gone) and
one the engine did not make. For each, the viewer's sessions table and its
page show the same status, task, mode, rounds, steps, cost, version and
parent as ``saucer sessions --json``; its rounds' costs are the ``ROUND_COST``
ledger of ``saucer state --json`` (a round's end is not counted again).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from tests.support.cli import CliResult, saucer_here
from tests.support.fake_openai import FakeOpenAI
from tests.support.ui import write_session

from saucer.context import Context
from saucer.store import open_store
from saucer.ui import create_app


def _plan(task: str, commands: list[dict[str, Any]]) -> dict[str, Any]:
    return {"task": task, "steps": [{"subtask": f"step {i}", "commands": [c]} for i, c in enumerate(commands)]}


def _write(path: str, content: str = "x") -> dict[str, Any]:
    return {"tool_name": "files.write", "parameters": {"path": path, "content": content}}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("numbers")
    url = f"sqlite:///{folder}/events.db"

    def cli(*args: str, env: dict[str, str] | None = None, ok: bool = True) -> CliResult:
        # In this process: what is compared is what the commands store and print, not their process.
        result = saucer_here([*args, "--store", url], cwd=folder, env=env)
        if ok:
            assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-2000:])
        return result

    for name, commands in {
        "ok": [_write("a.txt"), _write("b.txt")],
        "bad": [_write("c.txt"), {"tool_name": "files.read", "parameters": {"path": "no-such-file.txt"}}],
        "long": [_write(f"l{i}.txt") for i in range(3)],
    }.items():
        (folder / f"{name}.json").write_text(json.dumps(_plan(f"task {name}", commands)))
    cli("run", "--plan", "ok.json", "--session-id", "plan-ok", "--workspace", "ws")
    cli("run", "--plan", "bad.json", "--session-id", "plan-failed", "--workspace", "ws", ok=False)
    cli(
        "run",
        "--plan",
        "long.json",
        "--session-id",
        "plan-stopped",
        "--workspace",
        "ws",
        env={"SAUCER_SYSTEM__MAX_STEP": "1"},
        ok=False,
    )
    with FakeOpenAI() as fake:
        look = lambda: fake.tool_calls(("files.list", {"path": "."}), usage=(1000, 500))  # noqa: E731
        fake.push(look(), fake.text("done", usage=(2000, 100)), look(), fake.text("done", usage=(10, 5)))
        # The model is scripted call by call: no session judge (eva_session) asks it for more.
        llm = {
            "SAUCER_LLM_BASE_URL": fake.base_url,
            "SAUCER_LLM_API_KEY": "sk-test",
            "SAUCER_SYSTEM__EVA_SESSION": "false",
        }
        cli(
            "run",
            "--mode",
            "normal",
            "--request",
            "look around",
            "--session-id",
            "llm-priced",
            "--workspace",
            "ws",
            env=llm | {"SAUCER_LLM_MODEL": "gpt-4o"},
        )
        cli(
            "run",
            "--mode",
            "normal",
            "--request",
            "look again",
            "--session-id",
            "llm-unpriced",
            "--workspace",
            "ws",
            env=llm | {"SAUCER_LLM_MODEL": "a-model-without-a-price"},
        )
    cli("fork", "plan-ok", "--as", "fork-idle")
    cli("fork", "plan-stopped", "--as", "fork-run")
    cli("resume", "fork-run")
    cli("export", "plan-failed", "--output", str(folder / "export.json"))
    cli("import", str(folder / "export.json"), "--as", "imported")
    cli("store", "prune", "plan-ok", "--keep-last", "2")
    with open_store(url) as store:
        write_session(store, "interrupted", steps=2, status="running")  # no runner holds it: interrupted
        plain = Context.open(store, "plain")  # not made by the engine: no status, no counts
        plain.set("REQUEST", "by hand")
        plain.commit()
        plain.close()
    listed = {row["id"]: row for row in json.loads(cli("sessions", "--json").stdout)}
    states = {sid: json.loads(cli("state", sid, "--json").stdout) for sid in listed}
    shown = {sid: json.loads(cli("show", sid, "--json").stdout)["session"] for sid in ("llm-priced", "fork-idle")}
    yield {"url": url, "folder": folder, "listed": listed, "states": states, "shown": shown}


def _fields(fragment: str) -> dict[str, str]:
    """``data-field`` name -> shown text (or its ``data-value``) in a piece of the page."""
    out: dict[str, str] = {}
    for m in re.finditer(r'<(\w+)([^>]*?)data-field="(\w+)"([^>]*)>(.*?)</\1>', fragment, re.S):
        attrs = m.group(2) + m.group(4)
        value = re.search(r'data-value="([^"]*)"', attrs)
        out[m.group(3)] = html.unescape(value.group(1) if value else re.sub(r"<[^>]+>", "", m.group(5)).strip())
    return out


def _number(text: str) -> float | None:
    return None if text == "null" else float(text)


def _count(text: str) -> int | None:
    return None if text == "-" else int(text)


def test_every_kind_of_session_is_there(made: dict[str, Any]) -> None:
    listed = made["listed"]
    assert {sid: row["status"] for sid, row in listed.items()} == {
        "plan-ok": "finished",
        "plan-failed": "failed",
        "plan-stopped": "stopped",
        "llm-priced": "finished",
        "llm-unpriced": "finished",
        "fork-idle": "not started",
        "fork-run": listed["fork-run"]["status"],
        "imported": "failed",
        "interrupted": "interrupted",
        "plain": "-",
    }
    assert listed["fork-run"]["status"] in ("finished", "stopped")  # it ran
    assert listed["llm-priced"]["cost"] and listed["llm-priced"]["cost"] > 0 and listed["llm-unpriced"]["cost"] is None
    # A fork has its parent's task and mode, and is "not started" until resumed; a folder's plans keep their own task.
    assert (
        (listed["fork-idle"]["task"], listed["fork-idle"]["mode"])
        == (listed["plan-ok"]["task"], listed["plan-ok"]["mode"])
        == ("task ok", "follower")
    )
    assert made["shown"]["fork-idle"] == listed["fork-idle"]


def test_the_table_and_each_page_show_what_the_cli_shows(made: dict[str, Any]) -> None:
    with open_store(made["url"]) as store:
        client = TestClient(create_app(store))
        table = client.get("/sessions").text
        for sid, row in made["listed"].items():
            tr = re.search(rf'<tr class="[^"]*" data-id="{re.escape(sid)}">(.*?)</tr>', table, re.S)
            assert tr is not None, sid
            page = client.get(f"/sessions/{sid}")
            assert page.status_code == 200, sid
            facts = re.search(r'<dl class="facts" id="facts">(.*?)</dl>', page.text, re.S)
            assert facts is not None
            for where, cells in (("table", _fields(tr.group(1))), ("page", _fields(facts.group(1)))):
                got = (
                    cells["status"],
                    cells["task"],
                    cells["mode"],
                    _count(cells["rounds"]),
                    _count(cells["steps"]),
                    _number(cells["cost"]),
                    int(cells["version"]),
                )
                want = (
                    row["status"],
                    row["task"],
                    row["mode"],
                    row["rounds"],
                    row["steps"],
                    row["cost"],
                    row["version"],
                )
                assert got == want, (sid, where)
            shown_parent = _fields(facts.group(1)).get("parent")
            assert shown_parent == row["parent"], sid
            if row["parent"]:
                parent_id = row["parent"].rsplit("@", 1)[0]
                assert f'href="/sessions/{parent_id}"' in facts.group(1)  # a link, not plain text


def test_round_costs_are_the_contexts_ledger_never_counted_twice(made: dict[str, Any]) -> None:
    with open_store(made["url"]) as store:
        client = TestClient(create_app(store))
        checked = 0
        for sid, state in made["states"].items():
            ledger = state["names"].get("ROUND_COST") or {}
            if not ledger:
                continue
            page = client.get(f"/sessions/{sid}").text
            for round_id, cost in ledger.items():
                section = re.search(rf'<section class="round[^"]*" id="r-{round_id}">(.*?)</summary>', page, re.S)
                assert section is not None, (sid, round_id)
                shown = re.search(r'<span class="rcost">([^<]*)</span>', section.group(1))
                if cost is None:
                    assert shown is not None and "unknown" in shown.group(1), (sid, round_id)
                elif cost:
                    assert shown is not None and shown.group(1) == f"{cost:.4f}", (
                        sid,
                        round_id,
                        shown and shown.group(1),
                        cost,
                    )
                checked += 1
            total = state["names"].get("SESSION_COST")
            if made["listed"][sid]["cost"] is not None and total is not None:
                assert made["listed"][sid]["cost"] == pytest.approx(total), sid
        assert checked >= 2  # the priced and the unpriced LLM sessions at least
        # The chart of cost and tokens is drawn when there is something to draw, never as an empty box.
        assert 'id="chart"' in client.get("/sessions/llm-priced").text
        assert 'id="chart"' not in client.get("/sessions/plan-ok").text


def test_unknown_costs_sort_last_both_ways_as_in_the_cli(made: dict[str, Any]) -> None:
    with open_store(made["url"]) as store:
        client = TestClient(create_app(store))
        for direction, reverse in (("desc", False), ("asc", True)):
            page = client.get("/sessions", params={"sort": "cost", "dir": direction}).text
            viewer = re.findall(r'<tr class="[^"]*" data-id="([^"]+)">', page)
            args = ["sessions", "--json", "--sort", "cost", "--store", made["url"]] + (["--reverse"] if reverse else [])
            listed = saucer_here(args, cwd=made["folder"])
            cli = [row["id"] for row in json.loads(listed.stdout)]
            assert viewer == cli, direction
            unknown = [sid for sid in cli if made["listed"][sid]["cost"] is None]
            assert cli[-len(unknown) :] == unknown  # last, whichever the direction


def test_the_inspector_shows_each_steps_llm_call_as_its_request_log_has_it(made: dict[str, Any]) -> None:
    """A click on an LLM step shows the call it made: model, tokens in and out, latency, cost, the prompt
    and the response, from the session's request log (the numbers as the log keeps them)."""
    from saucer.engine.logs import REQUEST_LOG, read_request_log

    with open_store(made["url"]) as store:
        folder = made["states"]["llm-priced"]["names"]["LOG_PATH"]
        logged = list(read_request_log(Path(folder) / REQUEST_LOG))
        steps = [e for e in store.read("llm-priced") if e.meta.get("kind") == "step"]
        client = TestClient(create_app(store))
        shown = 0
        for event in steps:
            panel = client.get(f"/sessions/llm-priced/steps/{event.version}").text
            calls = [c for c in logged if c.round == event.round and c.step == event.step]
            assert panel.count('<div class="icall">') == len(calls), event.version
            for call in calls:
                assert call.model == "gpt-4o" and f"<strong>{call.model}</strong>" in panel
                assert f"tokens {call.prompt_tokens} in / {call.completion_tokens} out" in panel, panel
                assert call.latency_ms is not None and f"{round(call.latency_ms, 1)} ms" in panel
                assert call.cost is not None and call.cost > 0 and f"cost {call.cost:.4f}" in panel
                assert '<details class="prompt"><summary>prompt</summary>' in panel
                assert '<details class="response" open><summary>response</summary>' in panel
                shown += 1
        assert shown == len(logged) == 2  # both calls of the session, each beside its step
