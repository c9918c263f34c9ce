"""Web surfaces (issue 27, item 5): the Host check on every loopback address (IPv4 and IPv6),
the Origin check on every state-changing POST, and a token in every form."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from tests.support.ui import write_session

from saucer.store import EventStore, open_store
from saucer.ui import COOKIE, create_app
from saucer.ui.guard import host_name

SAUCER = [sys.executable, "-m", "saucer"]
TOKEN = "alice-token-0123456789"


def _token(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, "the page's form carries no token"
    return found.group(1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    st = open_store(f"sqlite:///{tmp_path}/ui.db")
    write_session(st, "s", steps=1)
    yield st
    st.close()


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_host_names_are_parsed_with_ports_and_brackets() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("[::1]") == "::1"
    assert host_name("LocalHost:80") == "localhost" and host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("[::1") == "" and host_name("::1") == "::1"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_saucer_ui_checks_the_host_on_every_loopback_address(tmp_path: Path, host: str) -> None:
    if host == "::1" and not _ipv6():
        pytest.skip("this machine has no IPv6 loopback")
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as st:
        write_session(st, "private-session")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")} | {"NO_COLOR": "1"}
    proc = subprocess.Popen(
        [*SAUCER, "ui", "--host", host, "--port", str(port), "--store", url],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    shown = f"[{host}]" if ":" in host else host
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                own = httpx.get(f"http://{shown}:{port}/sessions")
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.2)
        assert own.status_code == 200 and "private-session" in own.text
        assert httpx.get(f"http://{shown}:{port}/sessions", headers={"Host": f"localhost:{port}"}).status_code == 200
        rebound = httpx.get(f"http://{shown}:{port}/sessions", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400 and "private-session" not in rebound.text  # DNS rebinding reads nothing
        bare = httpx.get(f"http://{shown}:{port}/sessions", headers={"Host": "attacker.example"})
        assert bare.status_code == 400
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_cross_site_posts_are_refused_before_any_handler(store: EventStore) -> None:
    c = TestClient(
        create_app(store, authenticate=lambda t: "alice" if t == TOKEN else None), base_url="http://127.0.0.1:8766"
    )
    csrf = _token(c.get("/login").text)
    form = {"token": TOKEN, "next": "/sessions/s", "csrf": csrf}
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame anywhere
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://127.0.0.1:9999"},  # another port is another origin
        {"Referer": "http://evil.example/page"},
        {"Sec-Fetch-Site": "cross-site"},
    ):
        refused = c.post("/login", data=form, headers=headers, follow_redirects=False)
        assert refused.status_code == 403 and COOKIE not in refused.headers.get("set-cookie", ""), headers
    # Chromium's own form under Referrer-Policy: no-referrer: Origin null, but same-origin by its fetch metadata.
    own = c.post("/login", data=form | {"token": "nope"}, headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"})
    assert own.status_code == 401
    signed = c.post("/login", data=form, headers={"Origin": "http://127.0.0.1:8766"}, follow_redirects=False)
    assert signed.status_code == 303 and COOKIE in signed.headers["set-cookie"]
    page = c.get("/sessions")
    assert page.status_code == 200
    out = c.post(
        "/logout", data={"csrf": _token(page.text)}, headers={"Origin": "http://evil.example"}, follow_redirects=False
    )
    assert out.status_code == 403 and c.get("/sessions", follow_redirects=False).status_code == 200  # still signed in


def test_every_form_carries_a_token_and_a_post_without_it_is_refused(store: EventStore) -> None:
    c = TestClient(create_app(store, authenticate=lambda t: "alice" if t == TOKEN else None))
    login = c.get("/login")
    assert login.text.count('name="csrf"') == login.text.count("<form")
    refused = c.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert refused.status_code == 403 and COOKIE not in refused.headers.get("set-cookie", "")
    forged = c.post("/login", data={"token": TOKEN, "csrf": "0" * 64}, follow_redirects=False)
    assert forged.status_code == 403
    other = TestClient(create_app(store, authenticate=lambda t: "alice" if t == TOKEN else None))
    foreign = _token(other.get("/login").text)  # another app's token, for another browser
    assert c.post("/login", data={"token": TOKEN, "csrf": foreign}, follow_redirects=False).status_code == 403
    signed = c.post("/login", data={"token": TOKEN, "csrf": _token(login.text)}, follow_redirects=False)
    assert signed.status_code == 303
    page = c.get("/sessions/s")
    assert page.status_code == 200 and 'action="/logout"' in page.text
    assert page.text.count('name="csrf"') >= 1 and _token(page.text)
    assert c.post("/logout", follow_redirects=False).status_code == 403  # no token: still signed in
    assert c.get("/sessions", follow_redirects=False).status_code == 200
    out = c.post("/logout", data={"csrf": _token(page.text)}, follow_redirects=False)
    assert out.status_code == 303 and c.get("/sessions", follow_redirects=False).status_code == 303


def test_the_cancel_form_of_saucer_ui_refuses_a_non_participant_and_a_session_not_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``saucer ui --allow-writes``'s cancel writes through saucer.engine.cancel.request_cancel: a session that
    declares participants refuses anyone else (403), one that is not running has nothing to cancel (409); a
    participant's cancel of a running session is recorded with its author. Nothing else is written."""
    from saucer.cli.ui_cmd import _local_acting

    monkeypatch.setattr("saucer.cli.common.local_user", lambda: "user:carol")
    url = f"sqlite:///{tmp_path}/acts.db"
    st = open_store(url)
    try:
        st.create_session("guarded", meta={"status": "running"}, participants=["user:alice"])
        st.acquire_lease("guarded", "a-runner", 60)
        write_session(st, "ended", steps=1)  # finished
        c = TestClient(create_app(st, acting=_local_acting(st, url, None)))
        token = _token(c.get("/sessions/ended").text)
        refused = c.post("/sessions/guarded/act/cancel", data={"csrf": token})
        assert refused.status_code == 403 and "user:carol" in refused.text
        ended = c.post("/sessions/ended/act/cancel", data={"csrf": token})
        assert ended.status_code == 409 and "is not running (finished)" in ended.text
        assert st.head("guarded") == 0
        monkeypatch.setattr("saucer.cli.common.local_user", lambda: "user:alice")
        alice = TestClient(create_app(st, acting=_local_acting(st, url, None)))
        token = _token(alice.get("/sessions/ended").text)
        done = alice.post(
            "/sessions/guarded/act/cancel", data={"csrf": token, "reason": "stop"}, follow_redirects=False
        )
        assert done.status_code == 303
        [event] = list(st.read("guarded"))
        assert (event.author, event.meta["kind"], event.meta["cancel"]) == (
            "user:alice",
            "cancel_request",
            {"reason": "stop"},
        )
    finally:
        st.close()
