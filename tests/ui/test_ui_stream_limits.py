"""Bounded connections (issue 27, item 4): the live pages of a process share one LISTEN connection,
and one principal may hold only so many of them open."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
import pytest
from tests.support.service import ALICE, FLEET_SHARING, TOKENS_ENV, Processes, auth, free_port, sharing_toml
from tests.support.ui import ViewerServer, write_session

from saucer.store import open_store
from saucer.ui import create_app

STREAMS = 200


def _postgres() -> str:
    url = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    if not url:
        hint = "set SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test to run the PostgreSQL tests"
        if os.environ.get("CI") == "true":
            pytest.fail(f"SAUCER_TEST_POSTGRES_URL is not set under CI=true; {hint}")
        pytest.skip(hint)
    return url


async def _open_streams(
    base: str, paths: list[str], headers: dict[str, str]
) -> tuple[list[int], list[httpx.Response], httpx.AsyncClient]:
    client = httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=None))
    responses: list[httpx.Response] = []

    async def one(path: str) -> int:
        request = client.build_request("GET", path, headers=headers | {"Accept": "text/event-stream"})
        response = await client.send(request, stream=True)
        responses.append(response)
        return response.status_code

    statuses = await asyncio.gather(*(one(p) for p in paths))
    return list(statuses), responses, client


def _connections(url: str, name: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE application_name LIKE %s GROUP BY 1",
            (f"%{name}%",),
        ).fetchall()
    return {row[0]: row[1] for row in rows}


def test_200_streams_under_saucer_serve_on_postgresql_share_one_listen_connection(tmp_path: Path) -> None:
    url = _postgres()
    import psycopg
    from psycopg import sql

    schema = "ui_" + uuid.uuid4().hex[:12]
    app_name = f"saucer-test-{schema}"
    store_url = f"{url}{'&' if '?' in url else '?'}schema={schema}&application_name={app_name}"
    procs = Processes(tmp_path)
    try:
        with open_store(store_url) as store:
            write_session(store, "watched", steps=1, status="running")
            head = store.head("watched")
        config = tmp_path / "saucer.toml"
        config.write_text(
            sharing_toml(FLEET_SHARING, tokens=TOKENS_ENV).replace(
                "[service]\n", f"[service]\nmax_streams = {STREAMS + 10}\n", 1
            )
        )
        port = free_port()
        procs.cli_server(port, tmp_path / "state", store_url, config=config)
        # The admin principal sees every session of the store through /ui (its scope is the records; use
        # a session the service ran instead when the records hold none): here alice submits one.
        procs.device(port, "dev-a")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
            plan = {
                "task": "t",
                "steps": [{"subtask": "one", "commands": [{"tool_name": "echo", "parameters": {"say": "x"}}]}],
            }
            answer = http.post("/api/sessions", json={"device_id": "dev-a", "task": plan}, headers=auth(ALICE))
            assert answer.status_code == 201, answer.text
            sid = answer.json()["session_id"]
            for _ in range(200):
                if http.get(f"/api/sessions/{sid}", headers=auth(ALICE)).json()["session"]["status"] == "finished":
                    break
                asyncio.run(asyncio.sleep(0.1))
            else:
                raise AssertionError(
                    f"session {sid} did not finish: {http.get(f'/api/sessions/{sid}', headers=auth(ALICE)).text}"
                )
        with open_store(store_url) as store:
            head = store.head(sid)

        async def scenario() -> tuple[list[int], dict[str, int]]:
            statuses, responses, client = await _open_streams(
                f"http://127.0.0.1:{port}", [f"/ui/sessions/{sid}/stream?after={head}"] * STREAMS, auth(ALICE)
            )
            try:
                await asyncio.sleep(1.0)  # every stream is subscribed and waiting
                held = await asyncio.to_thread(_connections, url, schema)
            finally:
                for response in responses:
                    await response.aclose()
                await client.aclose()
            return statuses, held

        statuses, held = asyncio.run(scenario())
        assert statuses == [200] * STREAMS
        listen = held.get(f"saucer listen {schema}", 0)
        assert listen == 1, held  # one LISTEN connection for every stream of the process
        total = sum(held.values())
        # The rest is the store's pools (10 + 4 at most), shared with everything else the server does.
        assert total <= 15, held
        assert total - listen <= 14
    finally:
        procs.cleanup()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_one_principal_may_hold_only_max_streams_live_pages(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    write_session(store, "s", steps=1, status="running")
    head = store.head("s")
    app = create_app(store, max_streams=3)
    with ViewerServer(app) as server:

        async def scenario() -> None:
            paths = [f"/sessions/s/stream?after={head}"] * 3
            statuses, responses, client = await _open_streams(server.url, paths, {})
            assert statuses == [200] * 3
            more, extra, other = await _open_streams(server.url, paths[:1], {})
            assert more == [429] and "max_streams" in (await extra[0].aread()).decode()
            await responses[0].aclose()  # a page closed: its place is free again
            await asyncio.sleep(0.5)
            again, back, third = await _open_streams(server.url, paths[:1], {})
            assert again == [200]
            for response in [*responses[1:], *back, *extra]:
                await response.aclose()
            for c in (client, other, third):
                await c.aclose()

        asyncio.run(scenario())
    store.close()
