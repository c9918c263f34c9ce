"""The viewer's step inspector, values, timeline, path and following, in real headless Chromium.

One store: a session written step by step through the Context (a list
appended to, a shell command that fails with output on both streams, typed
values, steps of known durations, agents moving between states), a fork of
it, and a plan session stopped at a step limit that ``saucer resume`` (another
process) continues while the page watches. Screenshots of the sessions page,
a session with the inspector open, a state page and a diff at 1400 px and at
390 px (a phone) are kept under ``$SAUCER_ARTIFACTS/ui`` (default
``tmp/artifacts/ui``); no page scrolls sideways at either width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_ui_browser import artifacts, browser, expect  # noqa: F401  (fixtures and the retrying assertion)

from saucer.context import Context
from saucer.engine.summaries import summary_of
from saucer.store import open_store
from saucer.ui import create_app

ZONE = "Europe/Paris"
SAUCER = [sys.executable, "-m", "saucer"]
#: How long each timed step of the "insp" session ran (seconds): the waterfall's bars follow them.
DURATIONS = (0.15, 0.3, 0.6)


def _commit(ctx: Context, **args: Any) -> int:
    """A commit as the engine makes it: with the summary delta of its meta."""
    return ctx.commit_step(**args, summary=summary_of(args["meta"]))


def _step(ctx: Context, number: int, agent: str, state: str, nxt: str, began: float, **meta: Any) -> int:
    return _commit(
        ctx,
        author=agent,
        round=1,
        step=number,
        meta={
            "kind": "step",
            "step": number,
            "session_step": number,
            "agent": agent,
            "state": state,
            "status": "CONTINUE",
            "next_agent": agent,
            "next_state": nxt,
            "started_at": began,
            **meta,
        },
    )


def _inspected_session(store: Any) -> dict[str, int]:
    """The session "insp"; returns the versions of its interesting steps."""
    store.create_session(
        "insp", meta={"task": "inspect me", "mode": "follower", "request": "look", "status": "running"}
    )
    ctx = Context.open(store, "insp", author="system")
    ctx.update_vars(
        {
            "items": ["alpha"],
            "empty": "",
            "nothing": None,
            "flag": True,
            "nested": {"a": [1, 2, {"b": "c"}], "long": "y" * 2000},
        }
    )
    _commit(ctx, author="system", meta={"kind": "session_start", "session_status": "running"})
    ctx.set("CURRENT_ROUND_ID", 1)
    _commit(ctx, author="system", round=1, meta={"kind": "round_start", "request": "look"})
    versions: dict[str, int] = {}
    ctx.append("items", "beta")
    versions["append"] = _step(
        ctx,
        1,
        "planner",
        "PLAN",
        "ACT",
        time.time(),
        commands=[{"tool_name": "files.write", "parameters": {"path": "a.txt", "content": "hello"}}],
        results=[{"status": "success", "result": {"bytes_written": 5}}],
        cost=0.01,
    )
    began = time.time()
    time.sleep(DURATIONS[0])
    versions["shell"] = _step(
        ctx,
        2,
        "actor",
        "ACT",
        "ACT",
        began,
        commands=[{"tool_name": "shell.run", "parameters": {"cmd": "ls missing; echo done"}}],
        results=[
            {
                "status": "failure",
                "error": "exit code 2",
                "result": {
                    "exit_code": 2,
                    "stdout": "line one\nline two\n",
                    "stderr": "ls: missing: No such file\n",
                    "duration": 0.042,
                },
            }
        ],
        error="the command failed",
        cost=0.02,
    )
    for i, duration in enumerate(DURATIONS[1:], start=3):
        began = time.time()
        time.sleep(duration)
        ctx.update_vars({"n": i})
        versions[f"timed{i}"] = _step(ctx, i, "actor", "ACT", "CHECK" if i == 4 else "ACT", began, cost=0.03)
    _commit(ctx, author="system", round=1, meta={"kind": "round_end", "round_status": "finished"})
    _commit(
        ctx,
        author="system",
        meta={"kind": "session_end", "session_status": "failed", "summary": {"rounds": 1, "steps": 4, "cost": 0.09}},
    )
    versions["head"] = ctx.version
    ctx.fork("insp-fork", at=versions["shell"]).close()
    ctx.close()
    return versions


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, browser: Any, viewer_server: Any) -> Iterator[dict[str, Any]]:  # noqa: F811
    folder = tmp_path_factory.mktemp("viewer")
    url = f"sqlite:///{folder}/events.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")} | {"NO_COLOR": "1"}
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
    (folder / "plan.json").write_text(json.dumps(plan))
    stopped = subprocess.run(
        [*SAUCER, "run", "--plan", "plan.json", "--session-id", "stop-go", "--workspace", "ws", "--store", url],
        cwd=folder,
        env=env | {"SAUCER_SYSTEM__MAX_STEP": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert "stopped" in stopped.stdout + stopped.stderr, stopped.stdout + stopped.stderr
    store = open_store(url)
    versions = _inspected_session(store)
    with viewer_server(create_app(store)) as server:
        yield {"url": url, "viewer": server.url, "v": versions, "folder": folder, "env": env}
    store.close()


@pytest.fixture(scope="module")
def viewer_server() -> Any:
    from tests.support.ui import ViewerServer

    return ViewerServer


def _page(browser: Any, width: int, height: int = 900) -> Any:  # noqa: F811
    context = browser.new_context(timezone_id=ZONE, locale="en-US", viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.errors = errors  # type: ignore[attr-defined]
    return tab


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:  # noqa: F811
    tab = _page(browser, 1400)
    yield tab
    tab.context.close()
    assert tab.errors == [], tab.errors


def _no_sideways_scroll(tab: Any) -> None:
    widths = tab.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth, document.body.scrollWidth]"
    )
    assert widths[0] <= widths[1] and widths[2] <= widths[1], (tab.url, widths)


def test_the_inspector_shows_a_step_beside_the_timeline_without_a_reload(scene: dict[str, Any], page: Any) -> None:
    v = scene["v"]
    page.goto(f"{scene['viewer']}/sessions/insp")
    page.evaluate("window.__notReloaded = true")
    page.click(f"#v{v['append']} a.inspect")
    expect(page.locator("#inspected")).to_have_attribute("data-version", str(v["append"]))
    assert page.url.endswith(f"/sessions/insp?step={v['append']}")  # an address to share
    changes = page.locator("#i-changes")
    row = changes.locator("tr", has_text="vars.items")
    # Before → after of an appended list: the new item marked as appended, the old one not.
    assert row.locator(".before").inner_text().count("alpha") == 1 and "beta" not in row.locator(".before").inner_text()
    assert row.locator(".after .ch-added").count() == 1 and '"beta"' in row.locator(".after .ch-added").inner_text()
    assert "1 appended" in row.inner_text()
    assert page.locator("#i-transition").inner_text() == "planner: PLAN → planner: ACT"

    page.keyboard.press("ArrowDown")  # the next step: the failed shell command
    expect(page.locator("#inspected")).to_have_attribute("data-version", str(v["shell"]))
    assert page.url.endswith(f"?step={v['shell']}")
    terminal = page.locator("pre.term").first
    assert (
        terminal.inner_text() == "line one\nline two\n" or terminal.inner_text() == "line one\nline two"
    )  # newlines, not \n
    assert "No such file" in page.locator("pre.term.err").inner_text()
    assert "exit 2" in page.locator(".icommand").inner_text() and "42 ms" in page.locator(".icommand").inner_text()
    page.keyboard.press("ArrowUp")
    expect(page.locator("#inspected")).to_have_attribute("data-version", str(v["append"]))
    page.go_back()
    expect(page.locator("#inspected")).to_have_attribute("data-version", str(v["shell"]))
    assert page.evaluate("window.__notReloaded") is True
    page.goto(f"{scene['viewer']}/sessions/insp?step={v['shell']}")  # a shared address opens the inspector at once
    expect(page.locator("#inspected")).to_have_attribute("data-version", str(v["shell"]))
    assert page.locator(f"#v{v['shell']}.selected").count() == 1


def test_values_are_typed_folded_collapsible_and_keys_unbroken(scene: dict[str, Any], browser: Any) -> None:  # noqa: F811
    tab = _page(browser, 390)
    try:
        tab.goto(f"{scene['viewer']}/sessions/insp/state")
        state = tab.locator("#state")
        assert state.locator("tr", has_text="vars.empty").locator(".v-str.v-empty").inner_text() == '""'
        assert state.locator("tr", has_text="vars.nothing").locator(".v-null").inner_text() == "null"
        assert state.locator("tr", has_text="vars.flag").locator(".v-bool").inner_text() == "true"
        nested = state.locator("tr", has_text="vars.nested")
        fold = nested.locator("details.fold")
        assert "show all 2000 characters" in fold.inner_text() and fold.get_attribute("open") is None
        fold.locator("summary").click()
        assert fold.get_attribute("open") is not None and "y" * 2000 in fold.inner_text()
        obj = nested.locator("details.v-obj").first
        assert obj.get_attribute("open") is not None
        obj.locator("summary").first.click()  # collapses
        assert obj.get_attribute("open") is None
        # No key name is broken inside a word: each piece between the allowed breaks sits on one line.
        broken = tab.evaluate("""() => {
            const bad = [];
            document.querySelectorAll('.keyname').forEach((el) => {
                el.childNodes.forEach((node) => {
                    if (node.nodeType !== 3 || !node.textContent) return;
                    const r = document.createRange(); r.selectNodeContents(node);
                    const lines = new Set(Array.from(r.getClientRects()).map((x) => Math.round(x.top)));
                    if (lines.size > 1) bad.push(el.textContent);
                });
            });
            return bad;
        }""")
        assert broken == []
        _no_sideways_scroll(tab)
        assert tab.errors == []
    finally:
        tab.context.close()


def test_the_timeline_shows_time_failures_and_the_path(scene: dict[str, Any], page: Any) -> None:
    v = scene["v"]
    page.goto(f"{scene['viewer']}/sessions/insp")
    assert page.locator("#timeline li.item.sep").count() == 4  # session start/end, round start/end: thin separators
    assert page.locator("#timeline li.item:not(.sep)").count() == 4
    round_one = page.locator("#r-1 summary")
    assert (
        "4 steps" in round_one.inner_text()
        and "cost 0.0900" in round_one.inner_text()
        and "1 failed" in round_one.inner_text()
    )
    # The waterfall: each step's bar is as wide (relative to its round's track) as the step was long.
    ratios = []
    for name in ("timed3", "timed4"):
        item = page.locator(f"#v{v[name]}")
        duration = float(item.get_attribute("data-duration"))
        track = item.locator("svg.bar").bounding_box()
        bar = item.locator("svg.bar rect.span").bounding_box()
        ratios.append((duration, bar["width"] / track["width"]))
    span = float(page.locator("#r-1 .rdur").inner_text().split()[0]) * (
        1 if page.locator("#r-1 .rdur").inner_text().split()[1] == "s" else 0.001
    )
    for duration, ratio in ratios:
        assert ratio == pytest.approx(duration / span, rel=0.1, abs=0.01), (duration, ratio, span)
    assert ratios[1][1] / ratios[0][1] == pytest.approx(
        ratios[1][0] / ratios[0][0], rel=0.05
    )  # 0.6 s twice as wide as 0.3 s
    assert ratios[1][0] >= DURATIONS[2] and ratios[0][0] >= DURATIONS[1]

    page.check("#failures-only")
    assert page.locator("#timeline li.item:visible").count() == 2  # the failed step and the failed session end
    assert page.locator(f"#v{v['shell']}").is_visible() and not page.locator(f"#v{v['append']}").is_visible()
    page.uncheck("#failures-only")
    page.click("#first-failure")
    expect(page.locator("#inspected")).to_have_attribute("data-version", str(v["shell"]))

    path = page.locator("svg#path")
    assert (
        path.locator('[data-node="planner: PLAN"]').count() == 1
        and path.locator('[data-node="actor: CHECK"]').count() == 1
    )
    assert path.locator('[data-edge="actor: ACT → actor: ACT"]').text_content() == "2×"
    assert page.locator("#forks a[href='/sessions/insp-fork']").count() == 1
    page.click("#forks a[href='/sessions/insp-fork']")
    page.wait_for_url("**/sessions/insp-fork")
    assert (
        page.locator("#status").inner_text() == "not started"
        and page.locator("#parent a[href='/sessions/insp']").count() == 1
    )

    page.goto(f"{scene['viewer']}/sessions")
    counts = {
        a.get_attribute("data-status"): int(a.get_attribute("data-count"))
        for a in page.locator("#status-counts a").all()
    }
    assert counts == {"not started": 1, "failed": 1, "stopped": 1}
    # insp 0.09, insp-fork 0.03 (its parent's up to the branch point), stop-go 0: what the sessions listed cost
    assert page.locator("#total-cost").inner_text() == "0.1200"
    page.click("#status-counts a[data-status='failed']")
    expect(page.locator("table.sessions tbody tr")).to_have_count(1)
    assert page.locator("#total-cost").inner_text() == "0.0900"
    assert "ago" in page.locator("table.sessions td.c-updated time").first.inner_text()
    assert page.locator("table.sessions td.c-duration").first.inner_text().endswith(("s", "ms", "min"))


def test_a_stopped_session_is_followed_when_another_process_resumes_it(scene: dict[str, Any], page: Any) -> None:
    page.goto(f"{scene['viewer']}/sessions/stop-go")
    assert page.locator("#status").inner_text() == "stopped"
    expect(page.locator("#live-note")).to_contain_text("following")
    page.evaluate("window.__notReloaded = true")
    before = page.locator("#timeline li.item:not(.sep)").count()
    resume = subprocess.run(
        [*SAUCER, "resume", "stop-go", "--store", scene["url"]],
        cwd=scene["folder"],
        env=scene["env"],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert resume.returncode == 0, resume.stdout + resume.stderr
    expect(page.locator("#status")).to_have_text("finished")
    # the two steps left, and the session's verdict (eva_session is on by default)
    expect(page.locator("#timeline li.item:not(.sep)")).to_have_count(before + 3)
    assert page.locator("#status-cell.status-finished").count() == 1  # coloured as in the table
    assert page.evaluate("window.__notReloaded") is True


@pytest.mark.parametrize("width", [1400, 390])
def test_screenshots_without_sideways_scroll(scene: dict[str, Any], browser: Any, artifacts: Path, width: int) -> None:  # noqa: F811
    v = scene["v"]
    tab = _page(browser, width)
    try:
        shots = [
            ("sessions", "/sessions"),
            ("session-inspector", f"/sessions/insp?step={v['shell']}"),
            ("state", f"/sessions/insp/state?at={v['head']}"),
            ("diff", f"/sessions/insp/diff?from={v['append'] - 1}&to={v['timed3']}"),
        ]
        for name, path in shots:
            tab.goto(scene["viewer"] + path)
            _no_sideways_scroll(tab)
            tab.screenshot(path=str(artifacts / f"viewer-{width}-{name}.png"), full_page=True)
        assert tab.locator("#diff .ch-added").count() >= 1  # the appended item, highlighted in the diff too
        assert tab.errors == []
    finally:
        tab.context.close()
