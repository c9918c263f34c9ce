"""The live page's stream: server-sent events of steps another process commits, over a real server."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
from tests.support.ui import write_session

from saucer.store import open_store
from saucer.ui import create_app

WRITER = str(Path(__file__).with_name("ui_writer.py"))


def sse(lines: Iterator[str]) -> Iterator[tuple[str, str, str]]:
    """(event, id, data) of each server-sent event (pings skipped)."""
    event, ident, data = "message", "", []
    for line in lines:
        if line == "":
            if data:
                yield event, ident, "\n".join(data)
            event, ident, data = "message", "", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


def test_steps_committed_by_another_process_arrive_in_order_then_the_end(tmp_path: Path, viewer_server: type) -> None:
    url = f"sqlite:///{tmp_path}/live.db"
    store = open_store(url)
    write_session(store, "live", steps=1, status="running")
    after = store.head("live")
    writer = subprocess.Popen([sys.executable, WRITER, url, "live", "4", "0.3"], stdout=subprocess.PIPE, text=True)
    try:
        with viewer_server(create_app(store)) as server, httpx.Client(base_url=server.url, timeout=30) as http:
            page = http.get("/sessions/live")
            assert 'data-live="yes"' in page.text
            seen: list[tuple[str, str, dict | str]] = []
            with http.stream("GET", "/sessions/live/stream", params={"after": after}) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                for event, ident, data in sse(response.iter_lines()):
                    seen.append((event, ident, orjson.loads(data) if event == "step" else data))
                    if event in ("end", "problem"):
                        break
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
    steps = [item for item in seen if item[0] == "step"]
    assert [int(ident) for _, ident, _ in steps] == list(range(after + 1, after + 6))
    assert seen[-1][:1] == ("end",)
    first = steps[0][2]
    assert first["round_key"] == "r-1" and f'id="v{after + 1}"' in first["html"] and "echo" in first["html"]
    assert steps[-1][2]["status"] == "finished"
    store.close()


def test_a_reconnecting_client_continues_after_its_last_event_and_a_dropped_one_harms_nothing(
    tmp_path: Path, viewer_server: type
) -> None:
    url = f"sqlite:///{tmp_path}/live.db"
    store = open_store(url)
    write_session(store, "s", steps=3, status="finished")
    head = store.head("s")
    with viewer_server(create_app(store)) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(5):  # clients that hang up mid-stream
            with http.stream("GET", "/sessions/s/stream", params={"after": 0}) as response:
                next(sse(response.iter_lines()))
        with http.stream("GET", "/sessions/s/stream", headers={"Last-Event-ID": str(head - 2)}) as response:
            got = []
            for e, i, _ in sse(response.iter_lines()):
                got.append((e, i))
                if e == "end":
                    break  # the stream stays open: a resume by another process would come next
        assert got == [("step", str(head - 1)), ("step", str(head)), ("end", "")]
        assert http.get("/sessions/s").status_code == 200  # still serving
    store.close()


def test_a_session_deleted_while_followed_ends_the_stream_with_a_reason(tmp_path: Path, viewer_server: type) -> None:
    url = f"sqlite:///{tmp_path}/live.db"
    store = open_store(url)
    write_session(store, "gone", steps=1, status="running")
    with (
        viewer_server(create_app(store)) as server,
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream("GET", "/sessions/gone/stream", params={"after": store.head("gone")}) as response,
    ):
        events = sse(response.iter_lines())
        time.sleep(0.5)
        store.delete_session("gone")
        event, _, data = next(events)
    assert event == "problem" and "gone" in data
    store.close()
