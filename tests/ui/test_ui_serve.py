"""``saucer serve`` mounts the viewer at /ui, behind its tokens, each principal seeing its own sessions and devices."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from tests.support.service import ALICE, BOB, Processes, auth, free_port

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
