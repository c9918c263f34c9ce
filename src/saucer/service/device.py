"""The device side of service mode: connect, register, run commands, answer every one.

:func:`run_device` (the CLI's ``saucer device``) keeps one device connected to
a server: it registers under a fixed ``device_id``, runs each ``command``
batch through a local dispatcher (any object with ``async
execute_commands(commands, timeout) -> list[Result]``), heartbeats, and
reconnects with exponential backoff when the connection drops, resuming the
same registration.

Every command is answered. A dispatcher that raises, times out or returns the
wrong number of results produces failure results naming the cause; results
too large to send become failures too. Nothing is ever left unanswered, the
defect that made UFO's server wait 100 minutes.

A ``cancel`` frame stops a running batch: its execution is cancelled (for the
local MCP dispatcher, the tool call is cancelled and the shell server kills
the command's process group) and the batch is answered right away with
failures saying it was cancelled; that answer is the server's acknowledgement.

Across reconnects the device keeps:

- the ids of batches still running or answered but not yet delivered; it
  lists them in ``register.inflight`` and delivers the held answers once the
  same server instance accepts it again;
- a bounded cache of recent batches keyed by their exact commands (call_ids
  included). A restarted server resuming a session asks again for the step
  that was in flight when it died, with the same call_ids; the device answers
  from the cache (or joins the still-running execution) instead of running
  the step a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import os
import platform
import random
import socket
import ssl as ssl_module
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import orjson
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

import saucer
from saucer.dispatch.base import BasicCommandDispatcher
from saucer.dispatch.messages import Command, Result
from saucer.redaction import register_secret
from saucer.service.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    CancelFrame,
    CommandFrame,
    CommandResultsFrame,
    DeviceInfoRequestFrame,
    DeviceInfoResponseFrame,
    ErrorCode,
    ErrorFrame,
    HeartbeatAckFrame,
    HeartbeatFrame,
    ProtocolError,
    RegisteredFrame,
    RegisterFrame,
    TaskAcceptedFrame,
    TaskEndFrame,
    align_results,
    encode_frame,
    failure_results,
    frame_size,
    now,
    parse_frame,
)

_log = logging.getLogger("saucer.service.device")

DEVICE_TOKEN_ENV = "SAUCER_SERVICE_TOKEN"
"""Environment variable a device reads its bearer token from when none is passed."""


class CommandExecutor(Protocol):
    """What a device needs from its local dispatcher."""

    async def execute_commands(self, commands: list[Command], timeout: float) -> list[Result]:
        """Run ``commands`` within ``timeout`` seconds; one Result per Command, in order."""
        ...


class DeviceError(Exception):
    """The device cannot go on: reconnecting would not help."""


class DeviceAuthError(DeviceError):
    """The server refused the token."""


class DeviceRefused(DeviceError):
    """The server refused the registration (e.g. the device id belongs to another token)."""


_FATAL_REGISTER_CODES = {
    ErrorCode.DEVICE_OWNED,
    ErrorCode.UNAUTHORIZED,
    ErrorCode.INVALID_FRAME,
    ErrorCode.UNSUPPORTED_VERSION,
}


class DeviceClient:
    """One device's connection loop; :func:`run_device` is the usual way to run it."""

    def __init__(
        self,
        server_url: str,
        token: str,
        device_id: str,
        dispatcher: CommandExecutor,
        *,
        info: dict[str, Any] | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        max_failures: int | None = None,
        missed_heartbeats: int = 3,
        open_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        cache_size: int = 256,
        ssl: ssl_module.SSLContext | None = None,
        stop: asyncio.Event | None = None,
        approved_calls: set[str] | None = None,
    ) -> None:
        if backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        self.server_url = server_url
        self.device_id = device_id
        self.dispatcher = dispatcher
        self.info = dict(info or {})
        self.stop = stop or asyncio.Event()
        #: Call ids the server sent as approved by a person (see :func:`server_approver`).
        self.approved_calls = approved_calls if approved_calls is not None else set()
        self.registrations = 0
        self.server_instance: str | None = None
        self._token = token
        register_secret(token)
        self._backoff = (backoff_initial, backoff_max)
        self._max_failures = max_failures
        self._missed = missed_heartbeats
        self._open_timeout = open_timeout
        self._max_frame_bytes = max_frame_bytes
        self._ssl = ssl
        self._cache_size = cache_size
        self._ws: ClientConnection | None = None
        self._send_lock = asyncio.Lock()
        self._interval = 10.0
        self._last_heard = 0.0
        self._cache: OrderedDict[str, asyncio.Task[list[Result]]] = OrderedDict()
        self._running: dict[str, str] = {}  # response_id -> server instance it came from
        self._keys: dict[str, str] = {}  # response_id -> key of its execution in the cache
        self._cancelled: dict[str, str] = {}  # execution key -> why the server cancelled it
        self._outbox: dict[str, str] = {}  # response_id -> encoded command_results, for self.server_instance
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> None:
        """Stay connected until :attr:`stop` is set; raise :class:`DeviceError` when retrying is pointless."""
        delay, failures = self._backoff[0], 0
        try:
            while not self.stop.is_set():
                registered_before = self.registrations
                try:
                    await self._connection()
                except DeviceError:
                    raise
                except (OSError, WebSocketException, TimeoutError, ProtocolError, ConnectionError) as exc:
                    _log.warning(
                        "device %s: connection to %s failed: %s", self.device_id, self.server_url, _reason(exc)
                    )
                if self.stop.is_set():
                    break
                if self.registrations > registered_before:
                    delay, failures = self._backoff[0], 0  # it worked for a while: start again from short waits
                failures += 1
                if self._max_failures is not None and failures > self._max_failures:
                    raise DeviceError(f"gave up after {failures - 1} failed reconnection attempts to {self.server_url}")
                pause = random.uniform(delay / 2, delay)
                _log.info("device %s: reconnecting in %.2f s", self.device_id, pause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), pause)
                delay = min(delay * 2, self._backoff[1])
        finally:
            for task in list(self._tasks) + list(self._cache.values()):
                task.cancel()
            await asyncio.gather(*self._tasks, *self._cache.values(), return_exceptions=True)

    # ------------------------------------------------------------ connection

    async def _connection(self) -> None:
        try:
            ws = await connect(
                self.server_url,
                additional_headers={"Authorization": f"Bearer {self._token}"},
                open_timeout=self._open_timeout,
                ping_interval=None,  # liveness is the protocol heartbeat
                compression=None,
                max_size=self._max_frame_bytes * 4,
                ssl=self._ssl,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                body = exc.response.body.decode("utf-8", "replace")[:300] if exc.response.body else ""
                raise DeviceAuthError(f"server refused the token (HTTP {status}): {body}") from None
            raise
        async with ws:
            await self._register(ws)
            loop = asyncio.get_running_loop()
            self._last_heard = loop.time()
            self._ws = ws
            try:
                await self._flush_outbox(ws)
                await run_until_first(self._receive(ws), self._heartbeats(ws), self.stop.wait())
            finally:
                self._ws = None

    async def _register(self, ws: ClientConnection) -> None:
        inflight = sorted(set(self._running) | set(self._outbox))
        await ws.send(
            encode_frame(
                RegisterFrame(role="device", client_id=self.device_id, info=self._describe(), inflight=inflight)
            )
        )
        frame = parse_frame(await asyncio.wait_for(ws.recv(), self._open_timeout), max_bytes=None)
        if isinstance(frame, ErrorFrame):
            if frame.code in _FATAL_REGISTER_CODES:
                raise DeviceRefused(f"server refused device {self.device_id!r}: {frame.code}: {frame.message}")
            raise ConnectionError(f"registration failed: {frame.code}: {frame.message}")
        if not isinstance(frame, RegisteredFrame):
            raise ConnectionError(f"expected 'registered', got {frame.type!r}")
        if frame.server_instance != self.server_instance:
            # A new server process knows none of the old batches; it will ask again and the cache answers.
            self._outbox.clear()
            self.server_instance = frame.server_instance
        self._interval = frame.heartbeat_interval
        self._max_frame_bytes = frame.max_frame_bytes
        self.registrations += 1
        _log.info("device %s registered with %s (instance %s)", self.device_id, self.server_url, frame.server_instance)

    async def _flush_outbox(self, ws: ClientConnection) -> None:
        for response_id, text in list(self._outbox.items()):
            await self._send_text(ws, text)
            self._outbox.pop(response_id, None)

    async def _send_text(self, ws: ClientConnection, text: str) -> None:
        async with self._send_lock:
            await ws.send(text)

    async def _send(self, ws: ClientConnection, frame: BaseModel) -> None:
        await self._send_text(ws, encode_frame(frame))

    async def _heartbeats(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._interval)
            silent = loop.time() - self._last_heard
            if silent > self._interval * self._missed:
                raise ConnectionError(f"server silent for {silent:.1f} s")
            await self._send(ws, HeartbeatFrame(sent_at=now()))

    async def _receive(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        async for raw in ws:
            self._last_heard = loop.time()
            try:
                frame = parse_frame(raw, max_bytes=None)  # the transport already bounds the size
            except ProtocolError as exc:
                # The server fails the batch named by ``ref`` at once: no command goes unanswered.
                await self._send(ws, ErrorFrame(code=exc.code, message=exc.message, ref=exc.ref))
                continue
            if isinstance(frame, CommandFrame):
                self._start(frame)
            elif isinstance(frame, CancelFrame):
                self._cancel(frame)
            elif isinstance(frame, HeartbeatAckFrame):
                pass
            elif isinstance(frame, DeviceInfoRequestFrame):
                await self._send(
                    ws,
                    DeviceInfoResponseFrame(
                        request_id=frame.request_id, device_id=self.device_id, info=self._describe()
                    ),
                )
            elif isinstance(frame, ErrorFrame):
                if frame.code == ErrorCode.SUPERSEDED:
                    # Another process registered this device id; fighting over it would flap forever.
                    raise DeviceRefused(f"device {self.device_id!r} was taken over by a newer connection")
                _log.warning(
                    "device %s: server error %s: %s (ref %s)", self.device_id, frame.code, frame.message, frame.ref
                )
            elif isinstance(frame, (TaskAcceptedFrame, TaskEndFrame, RegisteredFrame)):
                _log.info("device %s: %s", self.device_id, frame.type)
            else:
                await self._send(
                    ws, ErrorFrame(code=ErrorCode.UNEXPECTED_FRAME, message=f"a device does not accept {frame.type!r}")
                )

    # -------------------------------------------------------------- commands

    def _start(self, frame: CommandFrame) -> None:
        self.approved_calls.update(frame.approved or ())
        key = _batch_key(frame.commands)
        execution = self._cache.get(key)
        if execution is None:
            execution = asyncio.create_task(self._execute(frame.commands, frame.timeout, key))
            self._cache[key] = execution
            self._trim_cache()
        else:
            self._cache.move_to_end(key)
            _log.info(
                "device %s: batch %s repeats a known batch; answering without running it again",
                self.device_id,
                frame.response_id,
            )
        assert self.server_instance is not None
        self._running[frame.response_id] = self.server_instance
        self._keys[frame.response_id] = key
        answer = asyncio.create_task(self._answer(frame, execution, self.server_instance))
        self._tasks.add(answer)
        answer.add_done_callback(self._tasks.discard)

    def _trim_cache(self) -> None:
        # Only finished executions are evicted: a running one may still be asked for again.
        for key in list(self._cache):
            if len(self._cache) <= self._cache_size:
                break
            if self._cache[key].done():
                del self._cache[key]

    def _cancel(self, frame: CancelFrame) -> None:
        """Stop the execution behind batch ``frame.response_id``; its answer (cancelled) acknowledges the cancel."""
        key = self._keys.get(frame.response_id)
        execution = self._cache.get(key) if key is not None else None
        if key is None or execution is None or execution.done():
            _log.info("device %s: cancel of batch %s: it is no longer running", self.device_id, frame.response_id)
            return
        _log.info("device %s: cancelling batch %s (%s)", self.device_id, frame.response_id, frame.reason)
        self._cancelled[key] = frame.reason
        execution.cancel()

    async def _execute(self, commands: list[Command], timeout: float, key: str) -> list[Result]:
        source = f"device {self.device_id!r}"
        try:
            async with asyncio.timeout(timeout):
                results = await self.dispatcher.execute_commands(commands, timeout)
        except asyncio.CancelledError:
            reason = self._cancelled.pop(key, None)
            if reason is None:
                raise  # the device is stopping
            return failure_results(commands, f"{source}: the batch was cancelled before it finished ({reason})")
        except TimeoutError:
            return failure_results(commands, f"{source}: commands did not finish within {timeout:g} s")
        except Exception as exc:
            _log.exception("device %s: dispatcher failed", self.device_id)
            return failure_results(commands, f"{source}: {type(exc).__name__}: {exc}")
        finally:
            self.approved_calls.difference_update(c.call_id for c in commands)
        try:
            checked = [r if isinstance(r, Result) else Result.model_validate(r) for r in results]
        except Exception as exc:
            return failure_results(
                commands, f"{source}: dispatcher returned something that is not a list of results: {exc}"
            )
        aligned, problems = align_results(commands, checked, source=f"{source} dispatcher")
        if problems:
            _log.warning("device %s: %s", self.device_id, "; ".join(problems))
        return aligned

    async def _answer(self, frame: CommandFrame, execution: asyncio.Task[list[Result]], instance: str) -> None:
        try:
            results = await asyncio.shield(execution)
            text = encode_frame(
                CommandResultsFrame(prev_response_id=frame.response_id, session_id=frame.session_id, results=results)
            )
            size = frame_size(text)
            if size > self._max_frame_bytes:
                error = f"device {self.device_id!r}: results of {size} bytes exceed the server's frame limit of {self._max_frame_bytes}"
                text = encode_frame(
                    CommandResultsFrame(
                        prev_response_id=frame.response_id,
                        session_id=frame.session_id,
                        results=failure_results(frame.commands, error),
                    )
                )
            if instance != self.server_instance:
                return  # that server is gone; its successor asks again and hits the cache
            ws = self._ws
            if ws is not None:
                try:
                    await self._send_text(ws, text)
                    return
                except ConnectionClosed:
                    pass
            if instance == self.server_instance:
                self._outbox[frame.response_id] = text  # delivered after re-registering with the same server
        finally:
            self._running.pop(frame.response_id, None)
            self._keys.pop(frame.response_id, None)

    def _describe(self) -> dict[str, Any]:
        return {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "pid": os.getpid(),
            "saucer": saucer.__version__,
            **self.info,
        }


async def run_device(
    server_url: str,
    token: str,
    device_id: str,
    dispatcher_factory: Callable[[], Any],
    **options: Any,
) -> None:
    """Connect ``device_id`` to ``server_url`` and serve commands until stopped.

    ``dispatcher_factory()`` is called once and may return the dispatcher, an
    awaitable of it, or an async context manager (entered for the device's
    lifetime, e.g. a local MCP dispatcher that starts its tool servers).
    ``options`` are those of :class:`DeviceClient` (``info``, ``backoff_initial``,
    ``backoff_max``, ``max_failures``, ``ssl``, ``stop``, ...).
    Raises :class:`DeviceAuthError` / :class:`DeviceRefused` when the server
    refuses the token or the device id, :class:`DeviceError` when the
    dispatcher cannot be made; any connection failure is retried.
    """
    try:
        made = dispatcher_factory()
        if inspect.isawaitable(made):
            made = await made
    except Exception as exc:
        raise DeviceError(f"the dispatcher factory failed: {type(exc).__name__}: {exc}") from exc
    async with contextlib.AsyncExitStack() as stack:
        if hasattr(made, "__aenter__") and hasattr(made, "__aexit__"):
            dispatcher = await stack.enter_async_context(made)
        else:
            dispatcher = made
            if isinstance(made, _AsyncClosable) and inspect.iscoroutinefunction(made.aclose):
                stack.push_async_callback(made.aclose)
        if not isinstance(dispatcher, BasicCommandDispatcher):
            raise DeviceError(f"{type(dispatcher).__name__} has no execute_commands(commands, timeout) method")
        await DeviceClient(server_url, token, device_id, dispatcher, **options).run()


@runtime_checkable
class _AsyncClosable(Protocol):
    """A dispatcher that is no context manager but has an ``aclose()`` to run when the device stops."""

    async def aclose(self) -> None: ...


def server_approver(approved: set[str]) -> Callable[[Command], Any]:
    """The approver of a device's dispatcher: a sensitive command runs when the server sent its
    call id as approved by a person (see :mod:`saucer.service.approvals`), else it is refused."""

    async def approve(command: Command) -> bool | str:
        if command.call_id in approved:
            return True
        return (
            "nobody at this device can confirm it and the server did not send it as approved "
            "(run saucer device with --yes to run sensitive commands unasked)"
        )

    return approve


def _batch_key(commands: list[Command]) -> str:
    canonical = orjson.dumps([c.model_dump(mode="json") for c in commands], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def run_until_first(*awaitables: Any) -> None:
    """Run ``awaitables`` as tasks until the first one ends; cancel the others and wait for them,
    then re-raise what the finished one raised (a device's receive loop, heartbeats and stop)."""
    parts = [asyncio.ensure_future(a) for a in awaitables]
    done, pending = await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
