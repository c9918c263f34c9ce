"""The viewer in real headless Chromium (Debian's ``chromium``, driven by Playwright): the pages a user clicks through.

A store holds the shipped demo and a session run by ``saucer serve`` with a
device; ``saucer ui`` (the real command) serves it. The browser opens the
sessions table, searches it, clicks into a session, steps the version, opens
a diff, follows a live session while another process commits steps, and signs
in to ``saucer serve``'s viewer at /ui. Screenshots are kept as artifacts in
the folder the test prints (``SAUCER_ARTIFACTS``, default ``tmp/artifacts``).

Under ``CI=true`` a missing Chromium or Playwright fails these tests; elsewhere
they skip with the command that installs it.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from tests.support.service import ALICE, Processes, auth, free_port
from tests.support.ui import HOSTILE, run_demo, write_session

from saucer.store import open_store

INSTALL = "apt-get install -y chromium && pip install playwright (the test extra: make install)"
WRITER = str(Path(__file__).with_name("ui_writer.py"))
ZONE = "Asia/Tokyo"


def _chromium() -> str:
    path = os.environ.get("SAUCER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    problem = None
    if path is None:
        problem = "Debian's chromium is not installed"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is not installed"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem}; under CI=true the browser tests must run: {INSTALL}")
        pytest.skip(f"{problem}: {INSTALL}")
    return path  # type: ignore[return-value]


@pytest.fixture(scope="module")
def artifacts() -> Path:
    folder = Path(os.environ.get("SAUCER_ARTIFACTS", Path.cwd() / "tmp" / "artifacts")).resolve() / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield launched
        finally:
            launched.close()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")} | {"COLUMNS": "200", "NO_COLOR": "1"}


def _wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            assert proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, f"{url} did not answer"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[dict[str, Any]]:
    """A store with the demo and a service session, ``saucer serve`` over it, and ``saucer ui`` over it."""
    folder = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{folder}/events.db"
    demo = run_demo(folder, url)
    procs = Processes(folder)
    ui: subprocess.Popen[str] | None = None
    try:
        port = free_port()
        procs.cli_server(port, folder / "state", url)
        procs.device(port, "dev-a")
        serve = f"http://127.0.0.1:{port}"
        plan = {
            "task": "service echo",
            "steps": [{"subtask": "say", "commands": [{"tool_name": "echo", "parameters": {"say": HOSTILE}}]}],
        }
        answer = httpx.post(
            f"{serve}/api/sessions", json={"device_id": "dev-a", "task": plan}, headers=auth(ALICE), timeout=20
        )
        assert answer.status_code == 201, answer.text
        service_sid = answer.json()["session_id"]
        deadline = time.monotonic() + 60
        while (
            httpx.get(f"{serve}/api/sessions/{service_sid}", headers=auth(ALICE), timeout=20).json()["session"][
                "status"
            ]
            != "finished"
        ):
            assert time.monotonic() < deadline, "the service session did not complete"
            time.sleep(0.3)
        with open_store(url) as store:
            write_session(store, "live-one", steps=1, status="running")
        ui_port = free_port()
        ui = subprocess.Popen(
            [sys.executable, "-m", "saucer", "ui", "--port", str(ui_port), "--store", url],
            cwd=folder,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        viewer = f"http://127.0.0.1:{ui_port}"
        _wait_http(f"{viewer}/sessions", ui)
        yield {"url": url, "demo": demo, "service": service_sid, "viewer": viewer, "serve": serve, "folder": folder}
    finally:
        if ui is not None:
            ui.send_signal(signal.SIGINT)
            try:
                ui.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                ui.kill()
        procs.cleanup()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(timezone_id=ZONE, locale="en-US", viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.errors = errors  # type: ignore[attr-defined]
    yield tab
    context.close()
    assert errors == [], errors  # no script errors, no Content-Security-Policy violations


def _local(iso: str) -> str:
    """What en-US ``toLocaleString`` shows for ``iso`` in :data:`ZONE`."""
    moment = _dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(ZoneInfo(ZONE))
    hour = moment.hour % 12 or 12
    return f"{moment.month}/{moment.day}/{moment.year}, {hour}:{moment:%M:%S} {'AM' if moment.hour < 12 else 'PM'}"


def expect(locator: Any) -> Any:
    """Playwright's retrying assertions (waiting with predicates of our own would need eval, which the pages' CSP forbids)."""
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=30_000)  # a loaded CI machine is slow; the default is 5 s
    return playwright_expect(locator)


def test_browse_search_click_in_step_versions_and_diff(scene: dict[str, Any], page: Any, artifacts: Path) -> None:
    demo, service = scene["demo"], scene["service"]
    page.goto(f"{scene['viewer']}/sessions")
    rows = page.locator("table.sessions tbody tr")
    assert rows.count() == 3
    assert (
        page.locator(f'a[href="/sessions/{demo}"]').is_visible()
        and page.locator(f'a[href="/sessions/{service}"]').is_visible()
    )
    stamp = page.locator("table.sessions time").first
    assert stamp.inner_text().endswith(
        " ago"
    )  # relative, with the time in the viewer's zone (not the server's) as its title
    assert stamp.get_attribute("title") == _local(stamp.get_attribute("datetime"))
    page.screenshot(path=str(artifacts / "1-sessions.png"), full_page=True)

    # A filter's select asks at once; back to "any" shows every session again.
    page.select_option('select[name="status"]', "finished")
    expect(page.locator("table.sessions tbody tr:not(.status-finished)")).to_have_count(0)
    expect(page.locator(f'a[href="/sessions/{demo}"]')).to_be_visible()
    assert "status=finished" in page.url
    page.select_option('select[name="status"]', "")
    expect(rows).to_have_count(3)

    page.fill('input[name="q"]', "demo")
    expect(rows).to_have_count(1)
    assert "q=demo" in page.url  # the search is in the address, to paste into an issue
    page.screenshot(path=str(artifacts / "2-search.png"), full_page=True)

    page.click(f'a[href="/sessions/{demo}"]')
    page.wait_for_url(f"**/sessions/{demo}")
    assert page.locator("#status").inner_text() == "finished"
    assert page.locator("section.round").count() >= 2 and page.get_by_text("files.write").first.is_visible()
    page.screenshot(path=str(artifacts / "3-session.png"), full_page=True)

    page.click("#state-link")
    page.wait_for_selector("#state")
    head = int(page.url.rsplit("=", 1)[1])
    page.click("#prev")
    page.wait_for_url(f"**/state?at={head - 1}")
    assert page.locator("#at").inner_text() == f"v{head - 1}"
    page.locator('input[type="range"]').evaluate("(r) => { r.value = 3; r.dispatchEvent(new Event('change')); }")
    page.wait_for_url("**/state?at=3")
    assert page.locator("#at").inner_text() == "v3" and page.get_by_text("REQUEST").first.is_visible()
    page.screenshot(path=str(artifacts / "4-state-v3.png"), full_page=True)

    page.click("#diff-prev")
    page.wait_for_url("**/diff?from=2&to=3")
    assert page.locator("#diff tbody tr").count() >= 1
    page.screenshot(path=str(artifacts / "5-diff.png"), full_page=True)

    page.goto(f"{scene['viewer']}/sessions/{service}")
    page.locator("#timeline li.kind-step a.inspect").first.click()
    expect(page.locator("#inspected")).to_contain_text("<script>alert")  # shown literally, never run
    page.screenshot(path=str(artifacts / "6-service-session.png"), full_page=True)


def test_follow_a_live_session_while_another_process_commits(scene: dict[str, Any], page: Any, artifacts: Path) -> None:
    page.goto(f"{scene['viewer']}/sessions/live-one")
    assert page.locator("#timeline").get_attribute("data-live") == "yes"
    expect(page.locator("#live-note")).to_contain_text("following")
    page.evaluate("window.__notReloaded = true")
    with open_store(scene["url"]) as store:
        head = store.head("live-one")
    writer = subprocess.Popen(
        [sys.executable, WRITER, scene["url"], "live-one", "3", "0.6"], stdout=subprocess.PIPE, text=True
    )
    try:
        page.wait_for_selector(f"#v{head + 1}")
        page.screenshot(path=str(artifacts / "7-live-first-step.png"), full_page=True)
        page.wait_for_selector(f"#v{head + 4}")
        expect(page.locator("#status")).to_have_text("finished")
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
    assert page.evaluate("window.__notReloaded") is True  # the steps came in without a reload
    assert page.locator("#head-version").inner_text() == str(head + 4)
    page.click(f"#v{head + 3} a.inspect")  # the step's result, in the inspector
    expect(page.locator("#inspected")).to_contain_text("live step 3 <done>")
    assert (
        page.locator("#live-note").inner_text() == "the session ended (finished); still following in case it is resumed"
    )
    page.screenshot(path=str(artifacts / "8-live-ended.png"), full_page=True)


def test_sign_in_to_the_viewer_of_saucer_serve(scene: dict[str, Any], page: Any, artifacts: Path) -> None:
    page.goto(f"{scene['serve']}/ui/sessions")
    page.wait_for_url("**/ui/login?next=*")
    page.fill('input[name="token"]', "not-the-token-0000000")
    page.click("#sign-in")
    assert "not valid" in page.locator("#problem").inner_text()
    assert page.errors == ["Failed to load resource: the server responded with a status of 401 (Unauthorized)"]
    page.errors.clear()  # the refusal was a 401, as it should be
    page.fill('input[name="token"]', ALICE)
    page.click("#sign-in")
    page.wait_for_url("**/ui/sessions")
    assert page.locator("table.sessions tbody tr").count() == 1  # alice's service session only
    page.click(f'a[href="/ui/sessions/{scene["service"]}"]')
    page.wait_for_selector("#timeline")
    page.click('a[href="/ui/devices"]')
    assert "online" in page.locator("#devices").inner_text()
    page.screenshot(path=str(artifacts / "9-serve-devices.png"), full_page=True)
