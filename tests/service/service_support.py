"""Helpers for service-mode tests: tokens, free loopback ports, and real processes that can always be killed.

A uniquely named module (not conftest) so test modules import it reliably next to other test directories' conftests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent

ALICE = "alice-token-000000000000"
BOB = "bob-token-1111111111111111"
FLEET = "fleet-token-22222222222222"
OPS = "ops-token-3333333333333333"
TOKENS_ENV = f"alice={ALICE},bob={BOB},fleet={FLEET},ops={OPS}"

# The fleet's devices (registered with FLEET's token) are shared explicitly with whoever submits to them in
# the tests; ``ops`` is an admin. A device id not listed here is usable by the token that registered it only.
FLEET_SHARING: dict[str, list[str]] = {
    "dev-a": ["alice", "bob"],
    "dev-b": ["alice", "bob"],
    "dev-raw": ["alice"],
    "dev-kill": ["alice"],
    "dev-frozen": ["alice"],
    "dev-r": ["alice"],
    "dev-cancel": ["alice"],
    "box": ["alice"],
    "laptop": ["alice"],
}


def sharing_toml(share: dict[str, Any], admins: tuple[str, ...] = ("ops",), tokens: str = "") -> str:
    """A saucer.toml ``[service]`` section: who may use which device (a list of principals, or a table with
    ``owner``/``principals``), the admins and, optionally, the tokens."""
    lines = ["[service]", "admins = [" + ", ".join(f'"{a}"' for a in admins) + "]"]
    if tokens:
        lines.append("tokens = [" + ", ".join(f'"{entry}"' for entry in tokens.split(",")) + "]")
    for device_id, access in share.items():
        table = access if isinstance(access, dict) else {"principals": access}
        lines.append(f'[service.devices."{device_id}"]')
        if table.get("owner"):
            lines.append(f'owner = "{table["owner"]}"')
        lines.append("principals = [" + ", ".join(f'"{p}"' for p in table.get("principals", [])) + "]")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def auth(token: str) -> dict[str, str]:
    """Authorization header for ``token``."""
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Proc:
    """A child process with its combined output in ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        """Everything the process printed so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` if the process is still running."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)


@dataclass
class Processes:
    """Starts server and device processes; the fixture kills whatever is left."""

    logdir: Path
    started: list[Proc] = field(default_factory=list)

    def spawn(
        self, name: str, args: list[str], env: dict[str, str] | None = None, *, module: str = "saucer.service"
    ) -> Proc:
        """Start ``python -m <module> <args>`` (``saucer.service``, or ``saucer`` for the CLI) in the log dir."""
        log = self.logdir / f"{name}-{len(self.started)}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        # Model settings of the developer's environment must not leak into the servers under test.
        for var in (
            "SAUCER_LLM_MODEL",
            "SAUCER_LLM_BASE_URL",
            "SAUCER_LLM_API_KEY",
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
        ):
            full_env.pop(var, None)
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.logdir,
            )
        proc = Proc(name, popen, log)
        self.started.append(proc)
        return proc

    def server(
        self,
        port: int,
        state_dir: Path,
        *,
        heartbeat: float = 0.5,
        missed: int = 3,
        max_frame_bytes: int = 64 * 1024,
        extra: tuple[str, ...] = (),
        share: dict[str, Any] = FLEET_SHARING,
    ) -> Proc:
        """Start a server on 127.0.0.1:``port`` (sharing ``share``) and wait until /health answers."""
        config = self.logdir / f"server-{len(self.started)}.toml"
        config.write_text(sharing_toml(share))
        proc = self.spawn(
            "server",
            [
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--state-dir",
                str(state_dir),
                "--heartbeat-interval",
                str(heartbeat),
                "--missed-heartbeats",
                str(missed),
                "--max-frame-bytes",
                str(max_frame_bytes),
                "--log-level",
                "warning",
                "--config",
                str(config),
                *extra,
            ],
            env={"SAUCER_SERVICE_TOKENS": TOKENS_ENV},
        )
        wait_until(lambda: _healthy(port), 60, f"server on port {port} to answer /health", proc)
        return proc

    def device(self, port: int, device_id: str, token: str = FLEET, *, wait: bool = True) -> Proc:
        """Start a device process with the fake dispatcher; wait until the server lists it online."""
        proc = self.spawn(
            f"device-{device_id}",
            [
                "device",
                "--server",
                f"ws://127.0.0.1:{port}/ws",
                "--device-id",
                device_id,
                "--dispatcher",
                "service_fakes:make_dispatcher",
                "--backoff-initial",
                "0.1",
                "--backoff-max",
                "0.5",
                "--log-level",
                "info",
            ],
            env={"SAUCER_SERVICE_TOKEN": token},
        )
        if wait:
            wait_until(lambda: device_online(port, device_id), 20, f"device {device_id} to register", proc)
        return proc

    def cli_server(
        self, port: int, state_dir: Path, store_url: str, *, heartbeat: float = 0.5, config: Path | None = None
    ) -> Proc:
        """Start ``saucer serve`` (the CLI) on 127.0.0.1:``port`` and wait until /health answers.

        Tokens and sharing come from ``config``, or else from a config with :data:`FLEET_SHARING` and the tokens.
        """
        if config is None:
            config = self.logdir / f"saucer-serve-{len(self.started)}.toml"
            config.write_text(sharing_toml(FLEET_SHARING, tokens=TOKENS_ENV))
        proc = self.spawn(
            "saucer-serve",
            [
                "serve",
                "--port",
                str(port),
                "--state-dir",
                str(state_dir),
                "--store",
                store_url,
                "--heartbeat-interval",
                str(heartbeat),
                "--log-level",
                "warning",
                "--config",
                str(config),
            ],
            env={"SAUCER_SERVICE_TOKENS": ""},
            module="saucer",
        )
        wait_until(lambda: _healthy(port), 60, f"saucer serve on port {port} to answer /health", proc)
        return proc

    def cli_device(
        self,
        port: int,
        device_id: str,
        workspace: Path,
        token: str = FLEET,
        *,
        yes: bool = True,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """Start ``saucer device`` (the CLI, built-in tools in ``workspace``, ``env`` added); wait until it is online."""
        proc = self.spawn(
            f"saucer-device-{device_id}",
            [
                "device",
                "--server",
                f"http://127.0.0.1:{port}",
                "--device-id",
                device_id,
                "--workspace",
                str(workspace),
                "--backoff-initial",
                "0.1",
                "--backoff-max",
                "0.5",
                *(["--yes"] if yes else []),
            ],
            env={"SAUCER_SERVICE_TOKEN": token, **(env or {})},
            module="saucer",
        )
        wait_until(lambda: device_online(port, device_id), 30, f"device {device_id} to register", proc)
        return proc

    def cleanup(self) -> None:
        """Kill every process still running and reap them all."""
        for proc in self.started:
            proc.kill(signal.SIGKILL)
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):  # a kernel that ignores SIGKILL
                proc.popen.wait(timeout=10)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def device_online(port: int, device_id: str, token: str = ALICE) -> bool:
    """True when the server on ``port`` lists ``device_id`` as online."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/api/devices", headers=auth(token), timeout=1.0)
    except httpx.HTTPError:
        return False
    return any(d["device_id"] == device_id and d["online"] for d in response.json().get("devices", []))


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None) -> None:
    """Poll ``check`` until true; fail with the process output when it never becomes true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.popen.poll() is not None:
            pytest.fail(f"{proc.name} exited with {proc.popen.returncode} while waiting for {what}:\n{proc.output()}")
        time.sleep(0.05)
    detail = f"\n{proc.name} output:\n{proc.output()}" if proc is not None else ""
    pytest.fail(f"timed out after {timeout} s waiting for {what}{detail}")


@dataclass
class Cluster:
    """A server process with two device processes, shared by a test module."""

    port: int
    procs: Processes
    server: Proc
    devices: dict[str, Proc]
    workdir: Path

    @property
    def http(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        """WebSocket URL."""
        return f"ws://127.0.0.1:{self.port}/ws"
