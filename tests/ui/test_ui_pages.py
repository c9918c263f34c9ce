"""The viewer's pages over real stores (SQLite; PostgreSQL when configured), through Starlette's TestClient."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from tests.support.ui import HOSTILE, many_sessions, run_demo, write_session

from saucer.context import Context, prune
from saucer.store import EventStore, open_store
from saucer.store.sqlite import SQLiteStore
from saucer.ui import COOKIE, create_app
from saucer.ui.queries import SessionQuery, list_sessions
from saucer.ui.values import key_html

TOKEN = "alice-token-0123456789"


def form_token(html: str) -> str:
    """The form token a page carries (every form of the viewer has one)."""
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, "the page has no form token"
    return found.group(1)


def text(html: str) -> str:
    """The page's visible text, roughly (tags dropped, entities kept)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("demo")
    url = f"sqlite:///{folder}/s.db"
    return url, run_demo(folder, url)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    st = open_store(f"sqlite:///{tmp_path}/ui.db")
    yield st
    st.close()


def client(store: EventStore, **kwargs: Any) -> TestClient:
    return TestClient(create_app(store, **kwargs))


def test_the_demo_session_on_every_page(demo: tuple[str, str]) -> None:
    url, sid = demo
    with open_store(url) as st:
        c = client(st)
        listing = c.get("/sessions")
        assert listing.status_code == 200 and f'href="/sessions/{sid}"' in listing.text
        assert "finished" in text(listing.text) and "demo" in text(listing.text)
        page = c.get(f"/sessions/{sid}")
        assert page.status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        body = text(page.text)
        assert "round 1" in body and "files.write" in page.text and "success" in body
        head = st.head(sid)
        # An ended session is still followed: another process may resume it.
        assert f'id="head-version">{head}<' in page.text and 'data-live="yes"' in page.text
        state = c.get(f"/sessions/{sid}/state", params={"at": 3})
        assert state.status_code == 200 and "v3" in text(state.text) and 'id="next"' in state.text
        at4 = c.get(re.search(r'id="next" rel="next" href="([^"]+)"', state.text)[1].replace("&amp;", "&"))
        assert "State at v4" in text(at4.text)
        changes = Context.open(st, sid, create=False, at=head).diff(3, head)
        diff = c.get(f"/sessions/{sid}/diff", params={"from": 3, "to": head})
        assert diff.status_code == 200 and all(str(key_html(key)) in diff.text for key in changes)
        history = c.get(f"/sessions/{sid}/history", params={"key": "REQUEST"})
        assert history.status_code == 200 and text(history.text).count("set") >= 1
        event = c.get(f"/sessions/{sid}/events/5")
        assert event.status_code == 200 and "Event v5" in event.text


def test_what_is_stored_is_what_is_shown(store: EventStore) -> None:
    write_session(store, "hostile", task=HOSTILE, request=HOSTILE, extra_var=HOSTILE)
    c = client(store)
    for url in (
        "/sessions",
        "/sessions/hostile",
        "/sessions/hostile/state?at=5",
        "/sessions/hostile/history?key=vars.hostile",
        "/sessions/hostile/diff?from=0&to=5",
        "/sessions/hostile/events/3",
        "/sessions?q=" + HOSTILE[:8],
    ):
        page = c.get(url)
        assert page.status_code == 200, (url, page.text)
        assert "<script>alert" not in page.text and "<b>bold</b>" not in page.text, url
        assert (
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; {{ 7*7 }}" in page.text or "&lt;script&gt;" in page.text
        ), url
        # The template never evaluated {{ 7*7 }} (the page's times, e.g. 23:49:01, may hold a 49 of their own).
        shown = re.sub(r"\d{4}-\d\d-\d\d|\d\d:\d\d(:\d\d(\.\d+)?)?", "", text(page.text))
        assert not re.search(r"(?<![\d.])49(?![\d.])", shown), url


def test_a_large_value_is_cut_with_a_link_to_all_of_it(store: EventStore) -> None:
    write_session(store, "big", steps=1, big=10_000)
    c = client(store)
    state = c.get("/sessions/big/state", params={"at": 3})
    assert "show all 10000 characters" in state.text
    link = re.search(r'href="(/sessions/big/state[^"]*key=vars.big)"', state.text.replace("&amp;", "&"))[1]
    full = c.get(link)
    assert full.status_code == 200 and "x" * 10_000 in full.text
    session = c.get("/sessions/big")
    assert "x" * 10_000 not in session.text  # the timeline lists steps; the inspector shows their values
    step = c.get("/sessions/big/steps/3")
    assert step.status_code == 200 and "show all 10000 characters" in step.text
    assert "x" * 10_000 in c.get("/sessions/big/events/3").text


def test_sessions_filters_search_sorting_and_paging(store: EventStore) -> None:
    many_sessions(store, 130)
    c = client(store)
    first = c.get("/sessions")
    assert "130 of 130 sessions" in text(first.text) and "page 1 of 3" in text(first.text)
    assert first.text.index("s00129") < first.text.index("s00128")  # most recently updated first
    failed = c.get("/sessions", params={"status": "failed"})
    assert f"{len(range(0, 130, 3))} of 130 sessions" in text(failed.text)
    assert "s00001" not in failed.text and "s00003" in failed.text
    found = c.get("/sessions", params={"q": "REQUEST NUMBER 77"})
    assert "1 of 130 sessions" in text(found.text) and "s00077" in found.text
    task = c.get("/sessions", params={"task": "task3", "sort": "id", "dir": "asc"})
    ids = re.findall(r'href="/sessions/(s\d+)"', task.text)
    assert ids == sorted(ids) and all(int(i[1:]) % 7 == 3 for i in ids)
    by_cost = re.findall(r'href="/sessions/(s\d+)"', c.get("/sessions", params={"sort": "cost"}).text)
    assert by_cost[:2] == ["s00129", "s00128"]
    page3 = c.get("/sessions", params={"page": 3})
    assert len(re.findall(r'href="/sessions/(s\d+)"', page3.text)) == 30 and "s00000" in page3.text
    assert c.get("/sessions", params={"page": 99}).status_code == 200  # past the end: the last page
    fragment = c.get("/sessions", params={"page": 2}, headers={"HX-Request": "true"})
    assert "<html" not in fragment.text and 'rel="next"' in fragment.text
    today = c.get("/sessions", params={"since": "2000-01-01", "until": "2999-12-31", "tzo": "-60"})
    assert "130 of 130" in text(today.text)
    assert "0 of 130" in text(c.get("/sessions", params={"until": "2001-01-01"}).text)


def test_the_listing_reads_the_store_in_one_query_whatever_its_size(tmp_path: Path) -> None:
    st = SQLiteStore(tmp_path / "q.db")
    many_sessions(st, 300)
    for query, total in (
        (SessionQuery(status="finished", sort="steps"), 200),
        (SessionQuery(), 300),
        (SessionQuery(q="number 1"), 111),
    ):
        statements: list[str] = []
        st._conn.set_trace_callback(statements.append)  # the store's own connection: what it asks SQLite
        page = list_sessions(st, query)
        st._conn.set_trace_callback(None)
        assert page.total == total and len(page.rows) == 50
        selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 1, selects  # the kept summaries (with the leases), never a log or a meta
    st.close()


def test_bad_addresses_get_a_page_that_says_why(store: EventStore) -> None:
    write_session(store, "s", steps=2)
    prune(store, "s", keep_last=2)
    c = client(store)
    first = store.first_version("s")
    cases = {
        "/sessions/ghost": (404, "no session &#39;ghost&#39;"),
        "/sessions/s/state?at=99": (400, "not 99"),
        f"/sessions/s/state?at={first - 1}": (400, "was pruned"),
        "/sessions/s/state?at=abc": (400, "not a version number"),
        f"/sessions/s/state?at={first}&key=NOPE": (400, "has no value"),
        "/sessions?sort=nonsense": (400, "is not one of"),
        "/sessions?since=yesterday": (400, "is not a date"),
        "/sessions?page=x": (400, "not a whole number"),
        "/sessions/s/history": (400, "name a key"),
        "/sessions/s/events/0": (400, "was pruned"),
        f"/sessions/s/events/{first + 99}": (400, f"not {first + 99}"),
        "/sessions/s/stream?after=99": (400, "not 99"),
    }
    for url, (status, words) in cases.items():
        page = c.get(url)
        assert page.status_code == status and words in page.text, (url, page.status_code, page.text[-400:])


def test_a_token_guards_every_page(store: EventStore) -> None:
    write_session(store, "s")
    c = client(store, authenticate=lambda token: "alice" if token == TOKEN else None)
    gone = c.get("/sessions/s/state?at=2", follow_redirects=False)
    assert gone.status_code == 303 and gone.headers["location"].startswith("/login?next=")
    assert c.get("/sessions/s/stream").status_code == 401
    assert (
        c.get("/sessions", headers={"Authorization": "Bearer wrong-token-0123456"}, follow_redirects=False).status_code
        == 303
    )
    assert c.get("/sessions", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    csrf = form_token(c.get("/login").text)
    refused = c.post("/login", data={"token": "nope", "next": "/sessions/s", "csrf": csrf}, follow_redirects=False)
    assert (
        refused.status_code == 401
        and "not valid" in refused.text
        and COOKIE not in refused.headers.get("set-cookie", "")
    )
    signed = c.post("/login", data={"token": TOKEN, "next": "/sessions/s", "csrf": csrf}, follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/sessions/s"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert c.get("/sessions/s").status_code == 200  # the cookie now
    elsewhere = c.post(
        "/login", data={"token": TOKEN, "next": "//evil.example/x", "csrf": csrf}, follow_redirects=False
    )
    assert elsewhere.headers["location"] == "/sessions"
    c.post("/logout", data={"csrf": form_token(c.get("/sessions").text)})
    assert c.get("/sessions", follow_redirects=False).status_code == 303


class _OnlyMine:
    def __init__(self, mine: set[str]) -> None:
        self.mine = mine

    async def session_ids(self, principal: str | None) -> set[str] | None:
        return self.mine if principal == "alice" else set()

    async def devices(self, principal: str | None) -> list[dict[str, Any]] | None:
        return [{"id": "<dev>", "owner": principal, "online": True, "last_heartbeat": 1.7e9, "platform": "linux"}]


def test_a_scope_shows_a_principal_only_its_own_sessions(store: EventStore) -> None:
    write_session(store, "mine")
    write_session(store, "theirs")
    c = client(store, authenticate=lambda t: "alice" if t == TOKEN else None, scope=_OnlyMine({"mine"}))
    h = {"Authorization": f"Bearer {TOKEN}"}
    listing = c.get("/sessions", headers=h)
    assert "/sessions/mine" in listing.text and "theirs" not in listing.text and "1 of 1" in text(listing.text)
    for url in (
        "/sessions/theirs",
        "/sessions/theirs/state?at=1",
        "/sessions/theirs/events/1",
        "/sessions/theirs/stream",
    ):
        assert c.get(url, headers=h).status_code == 404, url
    devices = c.get("/devices", headers=h)
    assert devices.status_code == 200 and "&lt;dev&gt;" in devices.text and "online" in devices.text


def test_forks_and_parents_link_to_each_other(store: EventStore) -> None:
    write_session(store, "p")
    ctx = Context.open(store, "p", create=False)
    ctx.fork("p-fork", at=3).close()
    ctx.close()
    c = client(store)
    assert 'href="/sessions/p-fork"' in c.get("/sessions/p").text
    child = c.get("/sessions/p-fork")
    assert 'href="/sessions/p"' in child.text and "at v3" in text(child.text)
    assert 'fork of <a class="parent" href="/sessions/p">p</a>@3' in c.get("/sessions").text


def test_a_session_the_engine_did_not_make_has_no_counts_in_the_listing(store: EventStore) -> None:
    ctx = Context.open(store, "plain")  # a Context of one's own, no engine: nothing counted, as its page says
    ctx.set("REQUEST", "by hand")
    ctx.commit()
    [row] = list_sessions(store, SessionQuery()).rows
    assert (row["status"], row["rounds"], row["steps"], row["cost"]) == ("-", None, None, None)


def test_version_zero_has_no_event(store: EventStore) -> None:
    write_session(store, "s", steps=1)
    assert client(store).get("/sessions/s/events/0").status_code == 404


def test_a_session_page_pages_its_timeline(store: EventStore) -> None:
    write_session(store, "long", steps=30)
    app = create_app(store)
    c = TestClient(app)
    from saucer.ui import queries

    view = queries.session_view(store, "long", limit=10)
    assert view.shown_from == store.head("long") - 9
    page = c.get("/sessions/long", params={"before": 10})
    assert 'id="v9"' in page.text and 'id="v10"' not in page.text and 'id="latest"' in page.text


def test_a_damaged_database_is_a_page_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    st = SQLiteStore(path)
    write_session(st, "s")
    c = client(st)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE session_meta SET meta = 'not json'")
    conn.commit()
    conn.close()
    assert c.get("/sessions").status_code == 200  # the listing reads the kept summaries, not the meta
    page = c.get("/sessions/s")
    assert page.status_code == 500 and "store error" in page.text and "not JSON" in page.text
    st.close()


def test_a_long_history_is_paged(store: EventStore) -> None:
    write_session(store, "h", steps=520)
    c = client(store)
    page = c.get("/sessions/h/history", params={"key": "vars.n"})
    assert "520 changes; 500 shown" in text(page.text) and page.text.count('href="/sessions/h/state?at=') == 500
    earlier = re.search(r'id="earlier" href="([^"]+)"', page.text)[1].replace("&amp;", "&")
    older = c.get(earlier)
    assert older.text.count('href="/sessions/h/state?at=') == 20 and 'id="latest"' in older.text


def test_without_a_token_only_this_machines_names_reach_the_viewer(store: EventStore) -> None:
    write_session(store, "s", steps=1)
    c = TestClient(create_app(store, allowed_hosts=["127.0.0.1", "localhost"]), base_url="http://127.0.0.1:8766")
    assert c.get("/sessions").status_code == 200
    assert c.get("/sessions", headers={"Host": "localhost:8766"}).status_code == 200
    rebound = c.get("/sessions", headers={"Host": "attacker.example:8766"})
    assert rebound.status_code == 400 and "s" not in rebound.text.replace("Invalid host header", "")


def test_a_steps_change_from_a_kept_state_equals_the_diff_of_two_versions(store: EventStore) -> None:
    from saucer.context.queries import change_of

    write_session(store, "s", steps=4)
    ctx = Context.open(store, "s", create=False)
    ctx.append("log", "a")
    ctx.commit()
    ctx.append("log", "b")
    ctx.update_vars(delete=["n"])
    ctx.commit()
    before = None
    for version in range(1, store.head("s") + 1):
        changes, before = change_of(store, "s", version, before)  # each from the one before: one event each
        assert changes == ctx.diff(version - 1, version) == ctx.change_at(version), version
    ctx.close()


def test_artifacts_are_served_from_the_sessions_log_folder_only(store: EventStore, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "shot.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (logs / "tree.json").write_text('{"role": "window", "children": [{"name": "<b>OK</b>"}]}')
    (tmp_path / "secret.png").write_bytes(b"\x89PNG secret")
    ctx = Context.open(store, "art", author="system")
    ctx.set("LOG_PATH", str(logs))
    ctx.commit_step(
        author="agent",
        round=1,
        step=1,
        meta={
            "kind": "step",
            "agent": "op",
            "state": "ACT",
            "artifacts": [
                {"kind": "screenshot", "path": str(logs / "shot.png"), "width": 4, "height": 4},
                {"kind": "ui_tree", "path": str(logs / "tree.json"), "nodes": 2},
                {"kind": "screenshot", "path": str(tmp_path / "secret.png")},
                {"kind": "screenshot", "path": str(logs / ".." / "secret.png")},
            ],
        },
    )
    ctx.close()
    c = client(store)
    panel = c.get("/sessions/art/steps/1")
    assert panel.status_code == 200 and '<img class="shot" src="/sessions/art/steps/1/artifacts/0"' in panel.text
    shot = c.get("/sessions/art/steps/1/artifacts/0")
    assert shot.status_code == 200 and shot.headers["content-type"] == "image/png" and shot.content.endswith(b"fake")
    tree = c.get("/sessions/art/steps/1/artifacts/1", params={"as": "html"})
    assert tree.status_code == 200 and "&lt;b&gt;OK&lt;/b&gt;" in tree.text and "<b>OK" not in tree.text
    for index in (2, 3, 9):
        assert c.get(f"/sessions/art/steps/1/artifacts/{index}").status_code == 404


def test_the_diff_from_one_hydrate_equals_the_contexts_diff(store: EventStore) -> None:
    from saucer.context.queries import diff_of

    write_session(store, "d", steps=5, big=50)
    ctx = Context.open(store, "d", create=False)
    head = store.head("d")
    for v1, v2 in ((0, head), (2, 5), (5, 2), (3, 3), (1, head - 1)):
        assert diff_of(store, "d", v1, v2) == ctx.diff(v1, v2), (v1, v2)
    ctx.close()


def test_a_kept_history_catches_up_with_new_commits_and_a_prune(store: EventStore) -> None:
    from saucer.context.retention import prune
    from saucer.ui.queries import Histories, history

    write_session(store, "h", steps=3)
    kept = Histories()
    assert (
        history(store, "h", "vars.n", kept) == history(store, "h", "vars.n") and len(history(store, "h", "vars.n")) == 3
    )
    ctx = Context.open(store, "h", create=False)
    for _ in range(4):
        ctx.incr("n")
        ctx.commit()
    ctx.close()
    assert (
        history(store, "h", "vars.n", kept) == history(store, "h", "vars.n") and len(history(store, "h", "vars.n")) == 7
    )
    prune(store, "h", keep_last=2)
    assert history(store, "h", "vars.n", kept) == history(store, "h", "vars.n")
