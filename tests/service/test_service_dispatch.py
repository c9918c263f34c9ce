"""WebSocketCommandDispatcher and DeviceClient against a real server on loopback, in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.fakes import FakeDispatcher
from tests.support.service import ALICE, BOB, FLEET, auth, free_port

from saucer.dispatch.messages import Command, ResultStatus
from saucer.dispatch.websocket import WebSocketCommandDispatcher
from saucer.service.device import DeviceAuthError, DeviceClient, DeviceError, DeviceRefused, run_device
from saucer.service.server import RunningServer, ServiceConfig, running_server

pytestmark = pytest.mark.anyio


def _config(**overrides: Any) -> ServiceConfig:
    settings: dict[str, Any] = dict(
        port=0,
        tokens={"alice": ALICE, "bob": BOB, "fleet": FLEET},
        state_dir=None,
        heartbeat_interval=0.2,
        # The fleet's devices that alice submits to, shared explicitly.
        devices={name: {"principals": ["alice"]} for name in ("d1", "secure")},
    )
    settings.update(overrides)
    return ServiceConfig(**settings)


class Device:
    """A DeviceClient running as a task, stoppable."""

    def __init__(self, server: RunningServer, device_id: str, token: str = FLEET, **options: Any) -> None:
        self.dispatcher = FakeDispatcher()
        self.stop = asyncio.Event()
        options.setdefault("backoff_initial", 0.05)
        options.setdefault("backoff_max", 0.2)
        self.client = DeviceClient(server.ws_url, token, device_id, self.dispatcher, stop=self.stop, **options)
        self.task = asyncio.create_task(self.client.run())

    async def registered(self, count: int = 1) -> None:
        """Wait until the client has registered ``count`` times."""
        async with asyncio.timeout(10):
            while self.client.registrations < count:
                if self.task.done():
                    self.task.result()
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Stop the client and wait for it."""
        self.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 5)


@contextlib.asynccontextmanager
async def server_with_device(device_id: str = "d1", **overrides: Any) -> AsyncIterator[tuple[RunningServer, Device]]:
    async with running_server(_config(**overrides)) as server:
        device = Device(server, device_id)
        try:
            await device.registered()
            yield server, device
        finally:
            await device.close()


def _dispatcher(server: RunningServer, device_id: str = "d1", grace: float = 0.0) -> WebSocketCommandDispatcher:
    return WebSocketCommandDispatcher(server.state.hub, device_id, "session-under-test", reconnect_grace=grace)


async def test_one_result_per_command_in_order_keeping_call_ids() -> None:
    async with server_with_device() as (server, device):
        commands = [
            Command(tool_name="echo", parameters={"n": 1}),
            Command(tool_name="fail", parameters={"error": "nope"}),
            Command(tool_name="sleep", parameters={"seconds": 0.05}),
            Command(tool_name="whoami"),
        ]
        results = await _dispatcher(server).execute_commands(commands, timeout=5)
        assert [r.call_id for r in results] == [c.call_id for c in commands]
        assert [r.status for r in results] == [
            ResultStatus.SUCCESS,
            ResultStatus.FAILURE,
            ResultStatus.SUCCESS,
            ResultStatus.SUCCESS,
        ]
        assert results[0].result == {"n": 1} and results[1].error == "nope"
        assert await _dispatcher(server).execute_commands([], timeout=1) == []
        assert len(server.state.hub.correlator) == 0


async def test_batch_timeout_fails_with_results_naming_it() -> None:
    async with server_with_device() as (server, device):
        commands = [Command(tool_name="sleep", parameters={"seconds": 3}), Command(tool_name="echo")]
        started = time.monotonic()
        results = await _dispatcher(server).execute_commands(commands, timeout=0.3)
        assert time.monotonic() - started < 1.5
        assert [r.status for r in results] == [ResultStatus.FAILURE, ResultStatus.FAILURE]
        assert all("timed out after 0.3 s waiting for device 'd1'" in (r.error or "") for r in results)
        assert [r.call_id for r in results] == [c.call_id for c in commands]
        # timeout=None (the BasicCommandDispatcher default) means the dispatcher's bounded default.
        bounded = WebSocketCommandDispatcher(server.state.hub, "d1", "s", default_timeout=0.2)
        results = await bounded.execute_commands([Command(tool_name="sleep", parameters={"seconds": 3})])
        assert "timed out after 0.2 s" in (results[0].error or "")
        # The device is still usable.
        again = await _dispatcher(server).execute_commands([Command(tool_name="echo")], timeout=5)
        assert again[0].status == ResultStatus.SUCCESS


async def test_device_side_exceptions_and_short_answers_become_failures() -> None:
    async with server_with_device() as (server, device):
        commands = [Command(tool_name="echo"), Command(tool_name="raise", parameters={"message": "kaput"})]
        started = time.monotonic()
        results = await _dispatcher(server).execute_commands(commands, timeout=30)
        assert time.monotonic() - started < 2  # answered, not waited out
        assert all(r.status == ResultStatus.FAILURE for r in results)
        assert all("RuntimeError: kaput" in (r.error or "") for r in results)
        short = [Command(tool_name="short"), Command(tool_name="echo")]
        results = await _dispatcher(server).execute_commands(short, timeout=30)
        assert [r.status for r in results] == [ResultStatus.SUCCESS, ResultStatus.FAILURE]
        assert "returned no result" in (results[1].error or "")


async def test_offline_and_unknown_devices_fail_at_once() -> None:
    async with running_server(_config()) as server:
        started = time.monotonic()
        results = await _dispatcher(server, "ghost").execute_commands([Command(tool_name="echo")], timeout=30)
        assert results[0].status == ResultStatus.FAILURE and "'ghost' is offline" in (results[0].error or "")
        assert time.monotonic() - started < 1


async def test_disconnect_fails_pending_commands_at_once_without_grace() -> None:
    async with server_with_device() as (server, device):
        call = asyncio.create_task(
            _dispatcher(server).execute_commands([Command(tool_name="sleep", parameters={"seconds": 20})], timeout=30)
        )
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await device.close()
        results = await asyncio.wait_for(call, 5)
        assert time.monotonic() - started < 1.5
        assert results[0].status == ResultStatus.FAILURE
        assert "'d1' disconnected" in (results[0].error or "")


async def test_reconnect_grace_delivers_results_after_a_network_blip() -> None:
    async with server_with_device(reconnect_grace=5.0) as (server, device):
        call = asyncio.create_task(
            _dispatcher(server, grace=5.0).execute_commands(
                [Command(tool_name="sleep", parameters={"seconds": 0.6})], timeout=20
            )
        )
        await asyncio.sleep(0.2)
        ws = device.client._ws
        assert ws is not None
        ws.transport.abort()  # the network drops; the device process lives on
        results = await asyncio.wait_for(call, 10)
        assert results[0].status == ResultStatus.SUCCESS, results[0].error
        assert device.client.registrations >= 2
        assert len(device.dispatcher.ran) == 1  # executed once, answered after the reconnect


async def test_a_restarted_device_loses_its_batch_which_fails_before_the_grace_ends() -> None:
    async with server_with_device(reconnect_grace=10.0) as (server, device):
        call = asyncio.create_task(
            _dispatcher(server, grace=10.0).execute_commands(
                [Command(tool_name="sleep", parameters={"seconds": 20})], timeout=30
            )
        )
        await asyncio.sleep(0.2)
        await device.close()
        started = time.monotonic()
        fresh = Device(server, "d1")  # same id, no memory of the batch
        try:
            results = await asyncio.wait_for(call, 5)
            assert time.monotonic() - started < 3
            assert results[0].status == ResultStatus.FAILURE
            assert "lost it (restarted?)" in (results[0].error or "")
        finally:
            await fresh.close()


async def test_results_too_large_for_a_frame_become_a_failure() -> None:
    async with server_with_device(max_frame_bytes=8192) as (server, device):
        results = await _dispatcher(server).execute_commands(
            [Command(tool_name="big", parameters={"size": 20_000})], timeout=10
        )
        assert results[0].status == ResultStatus.FAILURE
        assert "exceed the server's frame limit of 8192" in (results[0].error or "")


async def test_device_info_round_trip_and_device_listing() -> None:
    async with (
        server_with_device() as (server, device),
        httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE)) as http,
    ):
        info = (await http.get("/api/devices/d1/info")).json()
        assert info["info"]["saucer"] and info["info"]["pid"] > 0
        listed = (await http.get("/api/devices")).json()["devices"]
        assert [(d["device_id"], d["online"]) for d in listed] == [("d1", True)]
        assert (await http.get("/api/devices/nope")).status_code == 404


async def test_wrong_token_and_foreign_device_id_stop_the_device() -> None:
    async with server_with_device() as (server, device):
        with pytest.raises(DeviceAuthError, match="HTTP 401"):
            await DeviceClient(server.ws_url, "wrong-token-xxxxxxxxxxxx", "d2", FakeDispatcher()).run()
        # d1 is pinned to the fleet token: alice cannot take it over.
        with pytest.raises(DeviceRefused, match="another token"):
            await DeviceClient(server.ws_url, ALICE, "d1", FakeDispatcher()).run()
        assert server.state.hub.get("d1").connection is not None  # the real d1 is untouched


async def test_a_newer_connection_of_the_same_device_supersedes_the_old_one() -> None:
    async with server_with_device() as (server, device):
        second = Device(server, "d1")
        try:
            await second.registered()
            # The first process learns it was replaced and stops instead of fighting for the id.
            with pytest.raises(DeviceRefused, match="taken over"):
                await asyncio.wait_for(device.task, 5)
            results = await _dispatcher(server).execute_commands([Command(tool_name="echo")], timeout=5)
            assert results[0].status == ResultStatus.SUCCESS
            assert len(second.dispatcher.ran) == 1 and device.dispatcher.ran == []
        finally:
            await second.close()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return certfile, keyfile


async def test_tls_end_to_end(tmp_path: Path) -> None:
    certfile, keyfile = _self_signed(tmp_path)
    context = ssl.create_default_context(cafile=str(certfile))
    async with running_server(_config(ssl_certfile=certfile, ssl_keyfile=keyfile)) as server:
        assert server.ws_url.startswith("wss://")
        device = Device(server, "secure", ssl=context)
        try:
            await device.registered()
            async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE), verify=context) as http:
                task = {"task": "tls", "steps": [{"commands": [{"tool_name": "echo", "parameters": {"x": 1}}]}]}
                created = await http.post("/api/sessions", json={"device_id": "secure", "task": task})
                assert created.status_code == 201, created.text
                session = (await http.get(f"/api/sessions/{created.json()['session_id']}", params={"wait": 10})).json()
                assert session["session"]["status"] == "finished"
        finally:
            await device.close()


async def test_graceful_server_restart_leaves_sessions_to_resume(tmp_path: Path) -> None:

    from saucer.service.records import MemorySessionRecordStore, SessionStatus

    store = MemorySessionRecordStore()  # shared by both server lifetimes, like a state dir
    # ...and so is the event store of the sessions' Contexts.
    config = _config(port=free_port(), store_url=f"memory://graceful-{free_port()}-{time.monotonic_ns()}")
    lines = tmp_path / "lines.txt"
    plan = {
        "task": "two steps",
        "steps": [
            {
                "commands": [
                    {"tool_name": "append", "parameters": {"path": str(lines), "line": "step-0", "seconds": 0.6}}
                ]
            },
            {"commands": [{"tool_name": "append", "parameters": {"path": str(lines), "line": "step-1"}}]},
        ],
    }
    async with running_server(config, store=store) as first:
        device = Device(first, "d1")
        await device.registered()
        async with httpx.AsyncClient(base_url=first.http_url, headers=auth(ALICE)) as http:
            session_id = (await http.post("/api/sessions", json={"device_id": "d1", "task": plan})).json()["session_id"]
        async with asyncio.timeout(10):
            while not lines.exists():
                await asyncio.sleep(0.01)
    # Stopped gracefully mid-step: the session did not fail, nothing was committed.
    record = await store.get_session(session_id)
    assert record is not None and record.status == SessionStatus.RUNNING, record
    assert await store.steps(session_id) == []
    try:
        async with running_server(config, store=store) as second:
            await device.registered(2)  # the same device process reconnects with backoff
            async with httpx.AsyncClient(base_url=second.http_url, headers=auth(ALICE)) as http:
                body = (await http.get(f"/api/sessions/{session_id}", params={"wait": 10})).json()
            assert body["session"]["status"] == "finished", body["session"]["error"]
            assert body["session"]["attempts"] == 2 and body["session"]["resumed_from_step"] == 0
            assert lines.read_text().splitlines() == ["step-0", "step-1"]
            # The engine session was resumed, not started over.
            kinds = [e.meta.get("kind") for e in second.state.sessions.runner.store.read(session_id)]
            assert kinds.count("session_start") == 1 and kinds.count("session_resume") == 1, kinds
            # Submissions during a shutdown are refused rather than lost.
            second.state.sessions.begin_shutdown()
            async with httpx.AsyncClient(base_url=second.http_url, headers=auth(ALICE)) as http:
                refused = await http.post("/api/sessions", json={"device_id": "d1", "task": plan})
            assert refused.status_code == 503
    finally:
        await device.close()


async def test_a_batch_for_an_offline_device_waits_for_it_within_the_grace() -> None:
    async with server_with_device() as (server, device):
        await device.close()
        assert server.state.hub.get("d1").connection is None
        call = asyncio.create_task(_dispatcher(server, grace=5.0).execute_commands([Command(tool_name="echo")], 10))
        await asyncio.sleep(0.3)
        assert not call.done()
        back = Device(server, "d1")
        try:
            results = await asyncio.wait_for(call, 5)
            assert results[0].status == ResultStatus.SUCCESS and len(back.dispatcher.ran) == 1
        finally:
            await back.close()
        # Without a grace the same situation fails at once.
        started = time.monotonic()
        results = await _dispatcher(server, grace=0.0).execute_commands([Command(tool_name="echo")], 10)
        assert results[0].status == ResultStatus.FAILURE and time.monotonic() - started < 0.5


class ManagedDispatcher(FakeDispatcher):
    """A dispatcher that must be entered (like one that starts MCP servers)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = self.exited = False

    async def __aenter__(self) -> ManagedDispatcher:
        self.entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True


async def test_run_device_enters_the_dispatcher_and_refuses_bad_factories() -> None:
    async with running_server(_config()) as server:
        managed = ManagedDispatcher()
        stop = asyncio.Event()

        async def factory() -> ManagedDispatcher:
            return managed

        task = asyncio.create_task(
            run_device(server.ws_url, FLEET, "managed", factory, stop=stop, backoff_initial=0.05)
        )
        async with asyncio.timeout(10):
            while server.state.hub.get("managed") is None:
                await asyncio.sleep(0.01)
        results = await _dispatcher(server, "managed").execute_commands([Command(tool_name="echo")], 5)
        assert results[0].status == ResultStatus.SUCCESS and managed.entered and not managed.exited
        stop.set()
        await asyncio.wait_for(task, 5)
        assert managed.exited

        def broken() -> FakeDispatcher:
            raise OSError("no tools here")

        with pytest.raises(DeviceError, match="factory failed: OSError: no tools here"):
            await run_device(server.ws_url, FLEET, "broken", broken)
        with pytest.raises(DeviceError, match="no execute_commands"):
            await run_device(server.ws_url, FLEET, "broken", object)


async def test_a_session_writes_its_record_twice_and_its_long_poll_reads_nothing_back() -> None:
    from saucer.service.records import MemorySessionRecordStore, SessionRecord, SessionStatus, StepRecord

    class CountingStore(MemorySessionRecordStore):
        """Notes each write of a session's record: (what, status, attempts)."""

        def __init__(self) -> None:
            super().__init__()
            self.writes: list[tuple[str, str, int]] = []

        async def create_session(self, record: SessionRecord) -> None:
            self.writes.append(("create", record.status.value, record.attempts))
            await super().create_session(record)

        async def update_session(self, session_id: str, **changes: Any) -> SessionRecord:
            record = await super().update_session(session_id, **changes)
            self.writes.append(("update", record.status.value, record.attempts))
            return record

        async def steps(self, session_id: str) -> list[StepRecord]:
            self.writes.append(("read steps", "", 0))
            return await super().steps(session_id)

    store = CountingStore()
    config = _config(store_url=f"memory://two-writes-{time.monotonic_ns()}")
    plan = {"task": "one step", "steps": [{"commands": [{"tool_name": "echo", "parameters": {"x": 1}}]}]}
    async with running_server(config, store=store) as server:
        device = Device(server, "d1")
        try:
            await device.registered()
            async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE)) as http:
                created = await http.post("/api/sessions", json={"device_id": "d1", "task": plan})
                assert created.status_code == 201 and created.json()["status"] == "running"
                session_id = created.json()["session_id"]
                body = (await http.get(f"/api/sessions/{session_id}", params={"wait": 10})).json()
                again = (await http.get(f"/api/sessions/{session_id}")).json()
        finally:
            await device.close()
    # Created running (its first attempt counted), then ended: no write in between; the long-poll answers
    # the steps its run committed without reading them back (the later plain read does, and gets the same).
    assert store.writes == [("create", "running", 1), ("update", "finished", 1), ("read steps", "", 0)]
    assert again == body
    assert body["session"]["status"] == "finished" and body["session"]["attempts"] == 1
    assert body["session"]["resumed_from_step"] is None
    assert [s["status"] for s in body["steps"]] == ["completed"]
    stored = await store.get_session(session_id)
    assert stored is not None and stored.status == SessionStatus.COMPLETED
    assert body["session"] == stored.model_dump(mode="json")  # the long-poll answers the record the end wrote


async def test_an_end_record_skips_the_disk_and_a_lost_one_is_rebuilt_without_the_device(tmp_path: Path) -> None:
    from saucer.service.records import SessionRecord, SessionStatus, SqliteSessionRecordStore

    class NotingStore(SqliteSessionRecordStore):
        """Notes whether each update waited for the disk."""

        def __init__(self, path: Path) -> None:
            super().__init__(path)
            self.updates: list[tuple[str, bool]] = []

        async def update_session(self, session_id: str, *, derived: bool = False, **changes: Any) -> SessionRecord:
            record = await super().update_session(session_id, derived=derived, **changes)
            self.updates.append((record.status.value, derived))
            return record

    plan = {"task": "one step", "steps": [{"commands": [{"tool_name": "echo", "parameters": {"x": 1}}]}]}
    config = _config(state_dir=tmp_path / "state")
    store = NotingStore(tmp_path / "state" / "sessions.sqlite3")
    async with running_server(config, store=store) as server:
        device = Device(server, "d1")
        try:
            await device.registered()
            async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE)) as http:
                created = await http.post("/api/sessions", json={"device_id": "d1", "task": plan})
                session_id = created.json()["session_id"]
                ended = (await http.get(f"/api/sessions/{session_id}", params={"wait": 10})).json()["session"]
        finally:
            await device.close()
    # The end record did not wait for the disk: the event store holds the end durably.
    assert ended["status"] == "finished" and store.updates == [("finished", True)]
    # As if it had been lost with the disk's cache: the record says running again.
    await store.update_session(session_id, status=SessionStatus.RUNNING, results=[])
    async with (
        running_server(config, store=store) as server,  # no device this time
        httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE)) as http,
    ):
        again = (await http.get(f"/api/sessions/{session_id}", params={"wait": 10})).json()
    await store.close()
    assert again["session"]["status"] == "finished" and again["session"]["attempts"] == 2
    assert [s["results"][0]["result"] for s in again["steps"]] == [{"x": 1}]
    assert again["session"]["results"] == ended["results"]
