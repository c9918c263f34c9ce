"""Acting on a session from its page (issue 30 item 6), in real headless Chromium.

``saucer ui --allow-writes`` (the real command) over a SQLite store: a set
and a delete from the page reach the store with ``user:<login>`` as author;
an approve from the page lets a waiting ``saucer run --no-input`` go on;
a stopped session resumed from its page runs to its end; a slow ``saucer run`` in
another process is cancelled from its page (and by ``saucer cancel``) and ends
``cancelled`` with the canceller recorded.
``saucer ui`` without the flag shows no forms and refuses the POST. A POST
without the form token or from another origin is refused. Under ``saucer
serve`` (with a device that asks for approvals), an admin cancels the owner's running
session from its page (the record and the log name the admin), and another
principal's POST is refused.
"""

from __future__ import annotations

import getpass
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_ui_browser import _env, _wait_http, browser, expect, page  # noqa: F401  (fixtures and helpers)
from tests.support.service import ALICE, BOB, FLEET, OPS, Processes, auth, free_port

from saucer.context import Context
from saucer.engine.approvals import read_approvals, request_question
from saucer.store import open_store

SAUCER = [sys.executable, "-m", "saucer"]
RM_PLAN = {
    "task": "cleanup",
    "steps": [
        {"subtask": "look", "commands": [{"tool_name": "shell.run", "parameters": {"command": "ls"}}]},
        {
            "subtask": "remove junk",
            "commands": [{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}],
        },
    ],
}
ME = f"user:{getpass.getuser()}"


def _ui(folder: Path, url: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [*SAUCER, "ui", "--port", str(port), "--store", url, *extra],
        cwd=folder,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    viewer = f"http://127.0.0.1:{port}"
    _wait_http(f"{viewer}/sessions", proc)
    return proc, viewer


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("acting")
    url = f"sqlite:///{folder}/events.db"
    with open_store(url) as store, Context.open(store, "notes", author="system") as ctx:
        ctx.set("REQUEST", "keep notes")
        ctx.update_vars(set={"old": 1})
        ctx.commit(meta={"kind": "vars"})
    plan = {
        "task": "stop then go",
        "steps": [
            {
                "subtask": f"s{i}",
                "commands": [{"tool_name": "files.write", "parameters": {"path": f"f{i}.txt", "content": str(i)}}],
            }
            for i in range(3)
        ],
    }
    (folder / "stop.json").write_text(json.dumps(plan))
    stopped = subprocess.run(
        [*SAUCER, "run", "--plan", "stop.json", "--session-id", "stop-go", "--workspace", "ws2", "--store", url],
        cwd=folder,
        env=_env() | {"SAUCER_SYSTEM__MAX_STEP": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert "stopped" in stopped.stdout + stopped.stderr, stopped.stdout + stopped.stderr
    writable, viewer = _ui(folder, url, "--allow-writes")
    readonly, plain = _ui(folder, url)
    try:
        yield {"url": url, "folder": folder, "viewer": viewer, "plain": plain}
    finally:
        _stop(writable)
        _stop(readonly)


def _last(url: str, sid: str) -> Any:
    with open_store(url) as store:
        return list(store.read(sid, store.head(sid) - 1, store.head(sid)))[0]


def test_set_and_delete_from_the_page_reach_the_store_with_the_author(local: dict[str, Any], page: Any) -> None:  # noqa: F811
    page.goto(f"{local['viewer']}/sessions/notes")
    page.fill('#vars-form textarea[name="set"]', 'count=3\nlabel="hi there"')
    page.click('#vars-form button[type="submit"]')
    expect(page.locator("#act-done")).to_contain_text("set count, label")
    event = _last(local["url"], "notes")
    assert event.author == ME and event.meta["kind"] == "vars"
    with open_store(local["url"]) as store, Context.open(store, "notes", create=False) as ctx:
        assert dict(ctx.vars) == {"old": 1, "count": 3, "label": "hi there"}
    page.fill('#vars-form input[name="delete"]', "old")
    page.click('#vars-form button[type="submit"]')
    expect(page.locator("#act-done")).to_contain_text("deleted old")
    assert _last(local["url"], "notes").author == ME
    with open_store(local["url"]) as store, Context.open(store, "notes", create=False) as ctx:
        assert "old" not in dict(ctx.vars) and ctx.vars["count"] == 3


def test_approve_from_the_page_lets_a_waiting_run_go_on(local: dict[str, Any], page: Any) -> None:  # noqa: F811
    folder = local["folder"]
    (folder / "plan.json").write_text(json.dumps(RM_PLAN))
    (folder / "ws").mkdir(exist_ok=True)
    (folder / "ws" / "junk.txt").write_text("junk")
    run = subprocess.Popen(
        [
            *SAUCER,
            "run",
            "--plan",
            "plan.json",
            "--workspace",
            "ws",
            "--session-id",
            "rm-run",
            "--no-input",
            "--store",
            local["url"],
        ],
        cwd=folder,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 40
        with open_store(local["url"]) as store:
            while not (store.exists("rm-run") and [a for a in read_approvals(store, "rm-run") if a.pending]):
                assert run.poll() is None and time.monotonic() < deadline, "no pending approval: " + str(
                    run.communicate()
                )
                time.sleep(0.2)
        page.goto(f"{local['viewer']}/sessions/rm-run")
        page.click("button[id^=approve-]")
        expect(page.locator("#act-done")).to_contain_text(f"approved by {ME}")
        out, errors = run.communicate(timeout=60)
        assert run.returncode == 0, out + errors
        assert not (folder / "ws" / "junk.txt").exists()  # the approved command ran
        with open_store(local["url"]) as store:
            [decided] = read_approvals(store, "rm-run")
        assert decided.status == "approved" and decided.decided_by == ME
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()


def test_answer_a_pending_question_from_the_page(local: dict[str, Any], page: Any) -> None:  # noqa: F811
    with open_store(local["url"]) as store:
        asked = request_question(store, "notes", "which colour?")
    page.goto(f"{local['viewer']}/sessions/notes")
    expect(page.locator(f"#pending-{asked.number}")).to_contain_text("which colour?")
    page.fill(f'#pending-{asked.number} input[name="answer"]', "blue")
    page.click(f"#pending-{asked.number} button")
    expect(page.locator("#act-done")).to_contain_text(f"answered by {ME}")
    with open_store(local["url"]) as store:
        [answered] = [a for a in read_approvals(store, "notes") if a.number == asked.number]
    assert answered.status == "answered" and answered.note == "blue" and answered.decided_by == ME
    assert page.locator(f"#pending-{asked.number}").count() == 0  # no longer waiting


def test_resume_a_stopped_session_from_its_page(local: dict[str, Any], page: Any) -> None:  # noqa: F811
    page.goto(f"{local['viewer']}/sessions/stop-go")
    assert page.locator("#status").inner_text() == "stopped"
    page.click("#resume-form button")
    expect(page.locator("#act-done")).to_contain_text("resume started")
    expect(page.locator("#status")).to_have_text("finished")  # the detached saucer resume ran it to its end
    assert (local["folder"] / "ws2" / "f2.txt").read_text() == "2"
    page.goto(f"{local['viewer']}/sessions/stop-go")
    assert page.locator("#resume-form").count() == 0  # a finished session offers no resume


def _slow_run(local: dict[str, Any], sid: str) -> subprocess.Popen[str]:
    """``saucer run`` of a plan of 60 half-second steps in another process; returns once its second step is committed."""
    folder = local["folder"]
    command = {"tool_name": "shell.run", "parameters": {"command": "sleep 0.5"}}
    plan = {"task": "slow", "steps": [{"subtask": f"nap {i}", "commands": [command]} for i in range(60)]}
    (folder / f"{sid}.json").write_text(json.dumps(plan))
    run = subprocess.Popen(
        [*SAUCER, "run", "--plan", f"{sid}.json", "--session-id", sid, "--workspace", "ws", "--store", local["url"]],
        cwd=folder,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    with open_store(local["url"]) as store:
        while not (store.exists(sid) and sum(e.meta.get("kind") == "step" for e in store.read(sid)) >= 2):
            assert run.poll() is None and time.monotonic() < deadline, "the run did not start: " + str(
                run.communicate()
            )
            time.sleep(0.2)
    return run


def _ended_cancelled(local: dict[str, Any], sid: str, run: subprocess.Popen[str], author: str, reason: str) -> None:
    """The run's process ended, and the log says: cancelled, by ``author``, no step started after the cancel was seen."""
    out, errors = run.communicate(timeout=60)
    assert run.returncode == 1 and "cancelled" in out + errors, out + errors
    with open_store(local["url"]) as store:
        events = list(store.read(sid))
        [row] = [r for r in store.list_sessions() if r.session_id == sid]
    [cancel] = [e for e in events if e.meta.get("kind") == "cancel_request"]
    assert cancel.author == author and cancel.meta["cancel"]["reason"] == reason
    end = events[-1]
    assert end.meta["kind"] == "session_end" and end.meta["session_status"] == "cancelled"
    expected = f"cancelled by {author}" + (f": {reason}" if reason else "")
    assert end.meta["summary"]["reason"] == expected
    assert row.status == "cancelled"  # the listing (saucer sessions, the viewer's table) says so too
    # the step in flight when the cancel was written may commit after it; the 60 steps did not all run
    assert sum(e.meta.get("kind") == "step" for e in events) < 60


def test_cancel_a_local_run_from_its_page(local: dict[str, Any], page: Any) -> None:  # noqa: F811
    """A ``saucer run`` in another process, cancelled from ``saucer ui --allow-writes``: the run ends cancelled,
    the cancel recorded with the page's user as author, and the page follows it to its end."""
    run = _slow_run(local, "slow-page")
    try:
        page.goto(f"{local['viewer']}/sessions/slow-page")
        expect(page.locator("#status")).to_have_text("running")
        page.fill('#cancel-form input[name="reason"]', "wrong <plan>")
        page.click("#cancel-form button")
        expect(page.locator("#act-done")).to_contain_text(f"cancelled by {ME}")
        _ended_cancelled(local, "slow-page", run, ME, "wrong <plan>")
        expect(page.locator("#status")).to_have_text("cancelled")
        expect(page.locator("#cancel-form")).to_be_hidden()  # an ended session offers no cancel (live)
        page.reload()
        assert page.locator("#cancel-form").count() == 0  # (nor on a new load)
        # a second cancel (a stale page) is refused with one sentence
        with httpx.Client(base_url=local["viewer"], timeout=20) as client:
            token = _token_and_cookies(client, "/sessions/notes")
            again = client.post("/sessions/slow-page/act/cancel", data={"csrf": token})
        assert again.status_code == 409 and "is not running (cancelled)" in again.text
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()


def test_cancel_a_local_run_from_the_cli(local: dict[str, Any]) -> None:
    """``saucer cancel ID`` from another terminal: the same function as the page, the same end."""
    run = _slow_run(local, "slow-cli")
    try:
        cancel = subprocess.run(
            [*SAUCER, "cancel", "slow-cli", "--reason", "enough", "--wait", "60", "--store", local["url"]],
            cwd=local["folder"],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert f"cancel requested by {ME}" in cancel.stdout
        assert f"ended cancelled: cancelled by {ME}: enough" in cancel.stdout
        _ended_cancelled(local, "slow-cli", run, ME, "enough")
        again = subprocess.run(
            [*SAUCER, "cancel", "slow-cli", "--store", local["url"]],
            cwd=local["folder"],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (
            again.returncode != 0 and "is not running (cancelled)" in again.stderr and "Traceback" not in again.stderr
        )
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()


def _token_and_cookies(client: httpx.Client, path: str) -> str:
    html = client.get(path).text
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def test_refused_posts_and_the_read_only_default(local: dict[str, Any], page: Any) -> None:  # noqa: F811
    head = lambda: open_store(local["url"]).head("notes")  # noqa: E731
    before = head()
    with httpx.Client(base_url=local["viewer"], timeout=20) as client:
        token = _token_and_cookies(client, "/sessions/notes")
        no_token = client.post("/sessions/notes/act/vars", data={"set": "x=1"})
        assert no_token.status_code == 403 and "reload" in no_token.text
        foreign = client.post(
            "/sessions/notes/act/vars", data={"csrf": token, "set": "x=1"}, headers={"Origin": "http://evil.example"}
        )
        assert foreign.status_code == 403 and "another site" in foreign.text
        assert head() == before  # nothing written
        ok = client.post("/sessions/notes/act/vars", data={"csrf": token, "set": "x=1"})  # the same, done right
        assert ok.status_code == 303 and head() == before + 1
    # saucer ui without --allow-writes: no forms, and the POST is refused with one sentence
    page.goto(f"{local['plain']}/sessions/notes")
    page.wait_for_selector("#timeline")
    assert page.locator("#act, #vars-form").count() == 0
    with httpx.Client(base_url=local["plain"], timeout=20) as client:  # its pages hold no form, so no token to send
        refused = client.post("/sessions/notes/act/vars", data={"set": "y=1"})
    assert refused.status_code == 403 and "--allow-writes" in refused.text
    assert head() == before + 1


def test_cancel_under_saucer_serve_and_a_principal_not_allowed(tmp_path: Path, page: Any) -> None:  # noqa: F811
    url = f"sqlite:///{tmp_path / 'events.db'}"
    config = tmp_path / "saucer.toml"
    config.write_text(
        f'[service]\ntokens = ["alice={ALICE}", "bob={BOB}", "fleet={FLEET}", "ops={OPS}"]\nadmins = ["ops"]\n'
        '[service.devices.laptop]\nprincipals = ["alice", "bob"]\n[approvals]\ntimeout = 120\n'
    )
    procs = Processes(tmp_path)
    try:
        port = free_port()
        procs.cli_server(port, tmp_path / "state", url, config=config)
        procs.cli_device(port, "laptop", tmp_path / "workspace", yes=False)
        serve = f"http://127.0.0.1:{port}"
        sid = httpx.post(
            f"{serve}/api/sessions", json={"device_id": "laptop", "task": RM_PLAN}, headers=auth(ALICE), timeout=20
        ).json()["session_id"]
        deadline = time.monotonic() + 40
        while not [
            a
            for a in httpx.get(f"{serve}/api/sessions/{sid}/approvals", headers=auth(ALICE), timeout=20).json()[
                "approvals"
            ]
            if a["status"] == "pending"
        ]:
            assert time.monotonic() < deadline, "no pending approval"
            time.sleep(0.2)
        # bob (who may use the device, but is not the session's owner, participant or an admin) is refused
        with httpx.Client(base_url=serve, timeout=20, headers=auth(BOB)) as bob:
            token = _token_and_cookies(bob, "/ui/sessions")
            refused = bob.post(f"/ui/sessions/{sid}/act/cancel", data={"csrf": token})
            assert refused.status_code in (403, 404), refused.text
        assert (
            httpx.get(f"{serve}/api/sessions/{sid}", headers=auth(ALICE), timeout=20).json()["session"]["status"]
            == "running"
        )
        ops = httpx.get(f"{serve}/ui/sessions/{sid}", headers=auth(OPS), timeout=20)  # an admin sees it, with the forms
        assert ops.status_code == 200 and 'id="vars-form"' in ops.text
        # the admin (not the owner) cancels it from the page: the record and the log name the admin
        page.goto(f"{serve}/ui/login")
        page.fill('input[name="token"]', OPS)
        page.click("#sign-in")
        page.wait_for_url("**/ui/sessions")
        page.goto(f"{serve}/ui/sessions/{sid}")
        assert page.locator("div.pending").count() == 1  # the pending approval, with its forms
        page.click("#cancel-form button")
        expect(page.locator("#act-done")).to_contain_text("cancelled by ops")
        record = httpx.get(f"{serve}/api/sessions/{sid}", headers=auth(ALICE), timeout=20).json()["session"]
        assert record["status"] == "cancelled" and record["error"].startswith("cancelled by ops"), record
        with open_store(url) as store:
            events = list(store.read(sid))
        [cancel] = [e for e in events if e.meta.get("kind") == "cancel_request"]
        assert cancel.author == "ops"
        assert events[-1].meta["session_status"] == "cancelled"
        assert events[-1].meta["summary"]["reason"].startswith("cancelled by ops")
        page.goto("about:blank")  # close the page's live stream before the server stops
    finally:
        procs.cleanup()
