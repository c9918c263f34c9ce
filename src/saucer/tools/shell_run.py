"""The shell tool's running of one command: options, the checks before the start, the process group.

A command runs as ``/bin/sh -c`` in its own process group, confined as the
options' :class:`~saucer.tools.confine.Policy` says, started behind a gate
until the group is announced to the orphan watchdog (:mod:`saucer.tools._orphans`).
On timeout, cancellation, or background children holding its output open,
the whole group is stopped (SIGTERM, a grace period, SIGKILL). Output past
``max_output`` bytes per stream is counted and dropped. The tool around it
(result, table, stdio server) is :mod:`saucer.tools.shell`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from saucer.tools._child import AsyncChild, start_child
from saucer.tools._child import CappedBuffer as _CappedBuffer
from saucer.tools._child import to_the_end as _to_the_end
from saucer.tools._common import SandboxError, offload, relative_to_root, resolve_in_root
from saucer.tools._orphans import forget_group, watch_group
from saucer.tools.confine import ConfinementError, Confiner
from saucer.tools.native import ToolError
from saucer.tools.rules import refusal_reason
from saucer.tools.shell_options import (
    DEFAULT_EXPECT_EXIT,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_TIMEOUT,
    DEFAULT_TIMEOUT,
    ShellOptions,
)

__all__ = [
    "DEFAULT_EXPECT_EXIT",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_MAX_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "ShellOptions",
    "ShellResult",
    "confiner",
    "run_command",
]

# Time a timed-out process group gets between SIGTERM and SIGKILL.
_KILL_GRACE = 1.0
# Time to collect the last output once the group is dead; a daemon that left
# the group may hold the pipes open forever, so the wait is bounded.
_DRAIN_GRACE = 1.0


class ShellResult(BaseModel):
    """What a finished command produced."""

    model_config = ConfigDict(defer_build=True)

    exit_code: int = Field(description="The exit status; negative when a signal ended the process.")
    stdout: str = Field(description="Standard output (UTF-8, undecodable bytes replaced), at most max_output bytes.")
    stderr: str = Field(description="Standard error, capped like stdout.")
    stdout_truncated: bool = Field(description="True when stdout was longer than the cap and was cut.")
    stderr_truncated: bool = Field(description="True when stderr was longer than the cap and was cut.")
    stdout_bytes: int = Field(description="Total bytes the command wrote to stdout.")
    stderr_bytes: int = Field(description="Total bytes the command wrote to stderr.")
    duration: float = Field(description="Seconds the command ran.")
    cwd: str = Field(description="Working directory, relative to the sandbox root.")
    note: str | None = Field(None, description="Anything unusual about the run, e.g. stopped background jobs.")


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _leader_exit(proc: AsyncChild) -> None:
    """Wait until the shell itself has exited (not for its output: a background child may hold it open)."""
    await proc.wait()


async def _stop_group(proc: AsyncChild, readers: list[asyncio.Task[None]]) -> None:
    """Terminate the command's whole process group: SIGTERM, a grace period, SIGKILL."""
    _kill_group(proc.pid, signal.SIGTERM)
    # Gone means: the shell has exited and nothing holds its output pipes any more.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_KILL_GRACE):
            await _leader_exit(proc)
            await asyncio.wait(readers)
    # Children may ignore SIGTERM; the group id outlives its leader, so this reaches them.
    _kill_group(proc.pid, signal.SIGKILL)


async def _clean_up(proc: AsyncChild, readers: list[asyncio.Task[None]], *, stop: bool) -> None:
    """Stop the group when ``stop``, collect its output readers, reap the shell and close its transport."""
    if stop:
        await _stop_group(proc, readers)
    if not all(r.done() for r in readers):
        await asyncio.wait(readers, timeout=_DRAIN_GRACE)
    for reader in readers:
        if not reader.done():
            reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), _DRAIN_GRACE)
    proc.close()
    forget_group(proc.pid)


def _format_partial(name: str, buffer: _CappedBuffer, limit: int = 2000) -> str:
    text = buffer.text()
    if not text:
        return ""
    shown = text[-limit:]
    return f"\n--- {name} (last {len(shown)} characters) ---\n{shown}"


def _prepare(
    command: str, options: ShellOptions, timeout: float | None, cwd: str | None, env: dict[str, str] | None
) -> tuple[float, Path, dict[str, str], str]:
    """The time limit, working directory, environment and shell of a command that may run; ToolError when not."""
    if not command.strip():
        raise ToolError("command is empty")
    try:
        confiner(options).check()
    except ConfinementError as exc:
        raise ToolError(str(exc)) from None
    reason = refusal_reason(command, options.allow, options.deny)
    if reason is not None:
        raise ToolError(reason)
    limit = options.timeout if timeout is None else timeout
    if limit <= 0:
        raise ToolError(f"timeout must be > 0 seconds, got {limit}")
    limit = min(limit, options.max_timeout)
    try:
        workdir = resolve_in_root(options.root, cwd or ".")
    except SandboxError as exc:
        raise ToolError(f"cwd refused: {exc}") from exc
    if not workdir.is_dir():
        raise ToolError(f"cwd {cwd!r} is not a directory")
    child_env = dict(os.environ if options.env is None else options.env)
    if env:
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ToolError(f"env values must be strings (bad keys: {bad})")
        child_env.update(env)
    child_env = confiner(options).environment(child_env)
    # Found as the operating system would find it (the child's PATH), so a missing shell is an error here.
    shell = shutil.which(options.shell, path=os.pathsep.join(os.get_exec_path(child_env)))
    if shell is None:
        raise ToolError(f"could not start {options.shell}: not found or not executable")
    return limit, workdir, child_env, shell


@functools.lru_cache(maxsize=64)
def confiner(options: ShellOptions) -> Confiner:
    """The :class:`Confiner` of ``options`` (one private temporary folder per options while in use)."""
    policy = options.policy
    if str(options.root) not in policy.write:  # options built without create(): the root is writable still
        policy = dataclasses.replace(policy, write=(str(options.root), *policy.write))
    return Confiner(policy)


# Runs as ``/bin/sh -c _GATE SHELL COMMAND``: wait for the host's newline (end of file: the host died
# before it announced the group, so never start), then become ``SHELL -c COMMAND`` with no input.
_GATE = 'IFS= read -r _ || exit 125; exec "$0" -c "$1" </dev/null'


async def run_command(
    command: str,
    options: ShellOptions,
    *,
    timeout: float | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> ShellResult:
    """Run ``command`` under ``options``; raise :class:`ToolError` when it is refused or times out.

    The checks before the start (parsing the line against the rules, resolving
    ``cwd``) run in a worker thread: a hostile line costs that thread, never
    the event loop of the server, which may be its host's own loop.
    """
    limit, workdir, child_env, shell = await offload(_prepare, command, options, timeout, cwd, env)
    started = time.monotonic()
    # The command waits at a gate until its group is announced to the watchdog: a host killed
    # between the start and the announcement would otherwise leave it running unwatched.
    gate_read, gate_write = os.pipe()
    try:
        proc = await start_child(
            confiner(options).start(
                ["/bin/sh", "-c", _GATE, shell, command],
                stdin=gate_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=child_env,
                start_new_session=True,  # its own process group, so a timeout kills the children too
            )
        )
    except BaseException as exc:  # cancelled too: a started child must see end of file, never wait on
        os.close(gate_write)
        if isinstance(exc, (OSError, ConfinementError)):
            raise ToolError(f"could not start {options.shell}: {exc}") from exc
        raise
    finally:
        os.close(gate_read)  # only now: the thread that started the command is done with it
    try:
        watch_group(proc.pid)  # stopped even if this process is killed outright (see saucer.tools._orphans)
        os.write(gate_write, b"\n")
    finally:
        os.close(gate_write)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _CappedBuffer(options.max_output), _CappedBuffer(options.max_output)
    readers = [asyncio.create_task(out.drain(proc.stdout)), asyncio.create_task(err.drain(proc.stderr))]
    timed_out = held_open = False
    try:
        async with asyncio.timeout(limit):
            await _leader_exit(proc)
            _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
            held_open = bool(pending)
    except TimeoutError:
        timed_out = True
    finally:
        # Timed out, cancelled by the client, or background children holding the
        # output open: never leave the group running behind the call.
        await _to_the_end(_clean_up(proc, readers, stop=proc.returncode is None or held_open or timed_out))
    duration = time.monotonic() - started
    if timed_out:
        raise ToolError(
            f"command timed out after {limit:g} s; its process group was killed"
            + _format_partial("stdout", out)
            + _format_partial("stderr", err)
        )
    return ShellResult(
        exit_code=proc.returncode if proc.returncode is not None else -1,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        duration=round(duration, 4),
        cwd=relative_to_root(options.root, workdir),
        note=(
            "background processes kept stdout/stderr open after the command exited; they were stopped "
            "(redirect a background job's output, e.g. `job > job.log 2>&1 &`, to keep it running)"
            if held_open
            else None
        ),
    )
