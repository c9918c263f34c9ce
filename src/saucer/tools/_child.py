"""A started ``subprocess.Popen`` seen from asyncio: its pipes as stream readers, its exit as an awaitable.

The shell starts its commands through :class:`saucer.tools.confine.Confiner`
(in a confined thread, or wrapped in bubblewrap), so asyncio's own
subprocess transport, which must call ``Popen`` itself in the loop's thread,
cannot be used. The exit is heard through a pidfd (Linux 5.3+) registered
with the loop, else by polling; the process is reaped here, and only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

__all__ = ["AsyncChild", "CappedBuffer", "start_child", "to_the_end"]

_POLL_MAX = 0.05
_READ_CHUNK = 64 * 1024


class AsyncChild:
    """``pid``, ``returncode``, ``stdout``/``stderr`` (StreamReaders) and :meth:`wait` of a Popen started with pipes."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._transports: list[asyncio.BaseTransport] = []
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._loop.call_soon(self._poll, 0.001)
        else:
            self._loop.add_reader(self._pidfd, self._reap)

    @classmethod
    async def attach(cls, popen: subprocess.Popen[bytes]) -> AsyncChild:
        """The child for ``popen``, with its stdout and stderr pipes (when it has them) connected to readers."""
        child = cls(popen)
        try:
            child.stdout = await child._reader(popen.stdout)
            child.stderr = await child._reader(popen.stderr)
        except BaseException:
            child.close()
            raise
        return child

    async def _reader(self, pipe: object) -> asyncio.StreamReader | None:
        if pipe is None:
            return None
        reader = asyncio.StreamReader(loop=self._loop)
        transport, _ = await self._loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        self._transports.append(transport)
        return reader

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has been reaped (negative: the signal that ended it)."""
        return self.popen.returncode if self._exited.done() else None

    def _reap(self) -> None:
        if self.popen.poll() is None:
            return  # woken early (never expected with a pidfd); the reader stays registered
        self._stop_watching()
        if not self._exited.done():
            self._exited.set_result(self.popen.returncode)

    def _poll(self, delay: float) -> None:
        if self.popen.poll() is not None:
            self._reap()
        elif not self._exited.done():
            self._loop.call_later(delay, self._poll, min(delay * 2, _POLL_MAX))

    def _stop_watching(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def wait(self) -> int:
        """The exit status, once the process has ended (its pipes may still be held open by others)."""
        return await asyncio.shield(self._exited)

    def close(self) -> None:
        """Close the pipe transports (a reader still waiting sees end of file) and stop watching the exit."""
        for transport in self._transports:
            transport.close()
        _close_pipes(self.popen)
        if not self._exited.done():
            self._stop_watching()
            self._exited.cancel()


class CappedBuffer:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        # Reading on past the cap keeps the child from blocking on a full pipe.
        while chunk := await stream.read(_READ_CHUNK):
            self.total += len(chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data.extend(chunk[:room])

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _shielded() -> contextlib.AbstractContextManager[object]:
    """The anyio scope the clean-up after a command runs in (see :func:`_to_the_end`).

    Under anyio (the stdio MCP server's task groups) a cancelled call -- the
    client went away, the server is shutting down -- has every await cancelled
    again: a shielded anyio scope keeps those cancellations out. Where anyio is
    not loaded (the in-process tools) there is no such scope, and importing it
    would cost every ``saucer run`` ~20 ms of start-up.
    """
    anyio = sys.modules.get("anyio")
    return anyio.CancelScope(shield=True) if anyio is not None else contextlib.nullcontext()


async def to_the_end(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run ``cleanup`` to its end even when the caller is cancelled meanwhile (a batch's deadline
    passing during a command's own grace period, a client going away), then pass the cancellation
    on: a clean-up cut short would leave the group running and its shell unreaped."""
    task = asyncio.ensure_future(cleanup)
    cancelled = False
    with _shielded():
        while True:
            try:
                await asyncio.shield(task)
                break
            except asyncio.CancelledError:
                if task.done():  # the clean-up itself was cancelled, not the wait for it
                    raise
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def _close_pipes(popen: subprocess.Popen[bytes]) -> None:
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


async def start_child(start: Future[subprocess.Popen[bytes]]) -> AsyncChild:
    """The :class:`AsyncChild` of a Popen being started in another thread (``start``).

    The start is awaited to its end even when the caller is cancelled meanwhile
    (its descriptors, the caller's included, are in use until then); a process
    started for a caller that is gone, or that cannot be attached, has its pipes
    closed here (it should be waiting at a gate the caller now closes).
    """
    outcome: list[subprocess.Popen[bytes] | BaseException] = []

    async def settle() -> None:
        try:
            started = await asyncio.wrap_future(start)
            outcome.append(started)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's task
            outcome.append(exc)

    try:
        await to_the_end(settle())
    except asyncio.CancelledError:
        if outcome and isinstance(outcome[0], subprocess.Popen):
            _close_pipes(outcome[0])
        raise
    popen = outcome[0]
    if isinstance(popen, BaseException):
        raise popen
    try:
        return await AsyncChild.attach(popen)
    except BaseException:
        _close_pipes(popen)
        raise
