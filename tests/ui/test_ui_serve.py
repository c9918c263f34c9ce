"""``saucer serve`` mounts the viewer at /ui, behind its tokens, each principal seeing its own sessions and devices."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from tests.support.service import ALICE, BOB, FLEET, OPS, Processes, auth, free_port

from saucer.ui import COOKIE


def test_serve_shows_each_principal_its_own_sessions_and_devices(processes: Processes, tmp_path: Path) -> None:
    port = free_port()
    store_url = f"sqlite:///{tmp_path / 'events.db'}"
    processes.cli_server(port, tmp_path / "state", store_url)
    processes.device(port, "dev-a")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
        plan = {
            "task": "echo <twice>",
            "steps": [{"subtask": "one", "commands": [{"tool_name": "echo", "parameters": {"say": "<hi>"}}]}],
        }
        submitted = http.post("/api/sessions", json={"device_id": "dev-a", "task": plan}, headers=auth(ALICE))
        assert submitted.status_code == 201, submitted.text
        sid = submitted.json()["session_id"]
        deadline = time.monotonic() + 30
        while http.get(f"/api/sessions/{sid}", headers=auth(ALICE)).json()["session"]["status"] != "finished":
            assert time.monotonic() < deadline
            time.sleep(0.2)

        anonymous = http.get("/ui/sessions", follow_redirects=False)
        assert anonymous.status_code == 303 and anonymous.headers["location"].startswith(
            "/ui/login?next=%2Fui%2Fsessions"
        )
        assert http.get(f"/ui/sessions/{sid}", headers=auth("wrong-token-000000000")).status_code == 303
        mine = http.get("/ui/sessions", headers=auth(ALICE))
        assert (
            mine.status_code == 200 and f'href="/ui/sessions/{sid}"' in mine.text and 'href="/ui/devices"' in mine.text
        )
        page = http.get(f"/ui/sessions/{sid}", headers=auth(ALICE))
        assert page.status_code == 200 and "echo" in page.text and "<hi>" not in page.text
        # A plan session writes no log folder (service.session_logs = "auto"); its verdict comes from its end event.
        assert not (tmp_path / "state" / "logs").exists()
        assert "<td>rules</td>" in page.text and "1/1 command(s) succeeded" in page.text
        step = re.search(
            r'<li class="item kind-step[^"]*"[^>]*>\s*<a class="inspect" href="[^"]*" data-fragment="([^"]+)"',
            page.text,
        )
        assert step is not None
        panel = http.get(step[1], headers=auth(ALICE))  # the step inspector: the command's parameters, escaped
        assert panel.status_code == 200 and "&lt;hi&gt;" in panel.text and "<hi>" not in panel.text
        assert http.get(step[1], headers=auth(BOB)).status_code == 404
        assert 'src="/ui/static/htmx.min.js"' in page.text
        assert http.get("/ui/static/htmx.min.js").status_code == 200
        theirs = http.get("/ui/sessions", headers=auth(BOB))
        assert sid not in theirs.text and "0 of 0 sessions" in theirs.text
        assert http.get(f"/ui/sessions/{sid}", headers=auth(BOB)).status_code == 404
        assert http.get(f"/ui/sessions/{sid}/stream", headers=auth(BOB)).status_code == 404
        devices = http.get("/ui/devices", headers=auth(ALICE))
        assert devices.status_code == 200 and "dev-a" in devices.text and "online" in devices.text

        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', http.get("/ui/login").text).group(1)  # type: ignore[union-attr]
        signed = http.post(
            "/ui/login", data={"token": ALICE, "next": f"/ui/sessions/{sid}", "csrf": csrf}, follow_redirects=False
        )
        assert signed.status_code == 303 and signed.headers["location"] == f"/ui/sessions/{sid}"
        assert "Path=/ui/" in signed.headers["set-cookie"] and http.cookies.get(COOKIE) == ALICE
        assert http.get(f"/ui/sessions/{sid}").status_code == 200  # by the cookie alone


def test_the_viewer_and_the_api_list_the_same_sessions_for_every_principal(
    processes: Processes, tmp_path: Path
) -> None:
    """One rule (saucer.service.sessions.sees_session): the owner, a participant its task names and an admin see a
    session, in ``GET /api/sessions`` and in ``/ui/sessions`` alike; anyone else sees it in neither."""
    port = free_port()
    processes.cli_server(port, tmp_path / "state", f"sqlite:///{tmp_path / 'events.db'}")  # admins: ops
    processes.device(port, "dev-a")  # shared with alice and bob

    def plan(participants: list[str]) -> dict[str, object]:
        step = {"subtask": "one", "commands": [{"tool_name": "echo", "parameters": {"say": "hi"}}]}
        return {"task": "echo", "steps": [step], "participants": participants}

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
        ids = {}
        for name, token, participants in (("alone", ALICE, []), ("shared", ALICE, ["bob"]), ("bobs", BOB, [])):
            made = http.post(
                "/api/sessions", json={"device_id": "dev-a", "task": plan(participants)}, headers=auth(token)
            )
            assert made.status_code == 201, made.text
            ids[name] = made.json()["session_id"]
        for sid in ids.values():  # finished, so both stores hold them
            deadline = time.monotonic() + 30
            while http.get(f"/api/sessions/{sid}", headers=auth(OPS)).json()["session"]["status"] != "finished":
                assert time.monotonic() < deadline
                time.sleep(0.2)
        expected = {
            "alice": {ids["alone"], ids["shared"]},
            "bob": {ids["shared"], ids["bobs"]},
            "fleet": set(),
            "ops": set(ids.values()),
        }
        for who, token in (("alice", ALICE), ("bob", BOB), ("fleet", FLEET), ("ops", OPS)):
            api = {s["session_id"] for s in http.get("/api/sessions", headers=auth(token)).json()["sessions"]}
            table = http.get("/ui/sessions", headers=auth(token), params={"limit": 100}).text
            ui = set(re.findall(r'href="/ui/sessions/([0-9a-f]{32})"', table))
            assert api == ui == expected[who], who
            for sid in ids.values():  # the one session's page and its API record agree too
                page = http.get(f"/ui/sessions/{sid}", headers=auth(token)).status_code
                record = http.get(f"/api/sessions/{sid}", headers=auth(token)).status_code
                assert (page, record) == ((200, 200) if sid in expected[who] else (404, 404)), (who, sid)
