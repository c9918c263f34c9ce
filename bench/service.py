"""Service mode over loopback: command round trip and throughput with 1, 10 and 50 devices.

    .venv/bin/python bench/service.py [--seconds 3] [--round-trips 2000]

The server (uvicorn + Starlette) and the WebSocketCommandDispatchers run in
this process; the devices run in one separate process (this script with
``--device-host``), each a real DeviceClient on its own WebSocket with an echo
dispatcher, all on 127.0.0.1. Measured:

- round trip: one device, one 1-command batch at a time (p50, p99, max);
- throughput: N devices, one closed loop per device sending 1-command batches
  for a fixed time; commands/s over all of them;
- session: an HTTP-submitted one-step plan until its status is final,
  including the SQLite stores' fsyncs (p50, p90, p99, mean, and the load
  average when it ends); with the default engine runner (an engine session in
  the event store, ``--runner engine``) or the plain plan runner (step records
  only, ``--runner plan``). The HTTP client runs in a process of its own
  (this script with ``--client``), after ``--warm-up`` sessions that are not
  counted, so the CPU per session is split three ways, each measured by the
  process itself or read from ``/proc``: the server (this process, by
  ``resource.getrusage``: the target of 3 ms is judged on it), the device,
  and the HTTP client (httpx, not saucer's cost). ``--strace`` also counts the
  ``fdatasync`` calls of the server per session (``strace -f -c`` attached
  to this process while the sessions run); quote what this script prints,
  with its load: on a disk the wall figures are mostly fsync latency, and
  they move with the disk and the load.

All loops are bounded by a count or a duration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.dispatch.websocket import WebSocketCommandDispatcher
from saucer.service.device import DeviceClient
from saucer.service.runner import PlanTaskRunner
from saucer.service.server import RunningServer, ServiceConfig, running_server


class EchoDispatcher:
    """Answers every command with its parameters."""

    async def execute_commands(self, commands: list[Command], timeout: float) -> list[Result]:
        return [Result(status=ResultStatus.SUCCESS, result=c.parameters, call_id=c.call_id) for c in commands]


async def _host_devices(url: str, token: str, prefix: str, count: int) -> None:
    stop = asyncio.Event()
    clients = [
        DeviceClient(url, token, f"{prefix}{i}", EchoDispatcher(), stop=stop, backoff_initial=0.1) for i in range(count)
    ]
    await asyncio.gather(*(c.run() for c in clients))


def _start_devices(server: RunningServer, token: str, prefix: str, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--device-host", server.ws_url, "--prefix", prefix, "--count", str(count)],
        env={**os.environ, "BENCH_TOKEN": token},
    )


async def _wait_online(server: RunningServer, ids: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    hub = server.state.hub
    while not all((d := hub.get(i)) is not None and d.online for i in ids):
        if time.monotonic() > deadline:
            raise RuntimeError("devices did not come online")
        await asyncio.sleep(0.05)


def _own_cpu() -> float:
    """CPU seconds of this process so far, all its threads (user and system)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _cpu_of(pid: int) -> float:
    """CPU seconds of process ``pid`` so far, all its threads (``/proc``: utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _round_trips(server: RunningServer, device_id: str, count: int) -> list[float]:
    dispatcher = WebSocketCommandDispatcher(server.state.hub, device_id, "bench")
    for _ in range(50):  # warm-up
        await dispatcher.execute_commands([Command(tool_name="echo")], 10)
    times = []
    for i in range(count):
        started = time.perf_counter()
        results = await dispatcher.execute_commands([Command(tool_name="echo", parameters={"i": i})], 10)
        times.append(time.perf_counter() - started)
        assert results[0].status == ResultStatus.SUCCESS, results[0].error
    return times


async def _throughput(server: RunningServer, ids: list[str], seconds: float) -> float:
    deadline = time.perf_counter() + seconds

    async def loop(device_id: str) -> int:
        dispatcher = WebSocketCommandDispatcher(server.state.hub, device_id, "bench")
        done = 0
        while time.perf_counter() < deadline:
            results = await dispatcher.execute_commands([Command(tool_name="echo")], 10)
            assert results[0].status == ResultStatus.SUCCESS, results[0].error
            done += 1
        return done

    started = time.perf_counter()
    total = sum(await asyncio.gather(*(loop(i) for i in ids)))
    return total / (time.perf_counter() - started)


async def _sessions(http_url: str, token: str, device_id: str, count: int) -> list[float]:
    plan = {"task": "bench", "steps": [{"commands": [{"tool_name": "echo", "parameters": {"x": 1}}]}]}
    times = []
    async with httpx.AsyncClient(base_url=http_url, headers={"Authorization": f"Bearer {token}"}) as http:
        for _ in range(count):
            started = time.perf_counter()
            created = await http.post("/api/sessions", json={"device_id": device_id, "task": plan})
            session_id = created.json()["session_id"]
            body = (await http.get(f"/api/sessions/{session_id}", params={"wait": 10})).json()
            assert body["session"]["status"] == "finished", body
            times.append(time.perf_counter() - started)
    return times


async def _concurrent_sessions(http_url: str, token: str, device_id: str, count: int, concurrency: int) -> list[float]:
    """``count`` sessions from ``concurrency`` closed loops at once (each its own connection)."""
    shares = [count // concurrency + (1 if i < count % concurrency else 0) for i in range(concurrency)]
    runs = await asyncio.gather(*(_sessions(http_url, token, device_id, n) for n in shares if n))
    return [t for run in runs for t in run]


def _client(http_url: str, device_id: str, count: int, warm_up: int, concurrency: int) -> None:
    """The HTTP client's process: warm up, say ``ready``, wait for ``go``, run, print the times and its CPU."""
    token = os.environ["BENCH_TOKEN"]
    asyncio.run(_concurrent_sessions(http_url, token, device_id, warm_up, concurrency))
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = _own_cpu()
    started = time.perf_counter()
    times = asyncio.run(_concurrent_sessions(http_url, token, device_id, count, concurrency))
    elapsed = time.perf_counter() - started
    print(json.dumps({"times": times, "cpu": _own_cpu() - cpu, "elapsed": elapsed}), flush=True)


class _Strace:
    """``strace -f -c -e trace=fdatasync,fsync`` attached to this process while a block runs (if strace is there)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.calls: int | None = None

    def start(self) -> None:
        if shutil.which("strace") is None:
            return
        self.process = subprocess.Popen(
            ["strace", "-f", "-c", "-e", "trace=fdatasync,fsync", "-p", str(os.getpid())],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)  # strace attaches to every thread before it counts

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        _, summary = self.process.communicate(timeout=30)
        calls = [
            int(line.split()[3]) for line in summary.splitlines() if line.rstrip().endswith(("fdatasync", "fsync"))
        ]
        self.calls = sum(calls) if calls else None


@dataclass
class _SessionRun:
    """What the client process measured and the CPU each process spent meanwhile (seconds, in total)."""

    times: list[float]
    elapsed: float  # seconds from the first submission to the last session's end
    server_cpu: float
    device_cpu: float
    client_cpu: float
    fsyncs: int | None  # the server's fdatasync/fsync calls (None: not counted)


async def _client_sessions(
    server: RunningServer,
    token: str,
    device: subprocess.Popen[bytes],
    count: int,
    warm_up: int,
    strace: bool,
    concurrency: int = 1,
) -> _SessionRun:
    """``count`` sessions submitted by a client process on device ``solo-0`` after ``warm_up`` uncounted ones,
    from ``concurrency`` closed loops."""
    client = subprocess.Popen(
        [sys.executable, __file__, "--client", server.http_url, "--device", "solo-0"]
        + ["--sessions", str(count), "--warm-up", str(warm_up), "--concurrency", str(concurrency)],
        env={**os.environ, "BENCH_TOKEN": token},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        line = await asyncio.to_thread(client.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"the client process did not start: {line!r}")
        tracer = _Strace()
        if strace:
            tracer.start()
        cpu, device_cpu = _own_cpu(), _cpu_of(device.pid)
        client.stdin.write("go\n")
        client.stdin.flush()
        report = json.loads(await asyncio.to_thread(client.stdout.readline))
        cpu, device_cpu = _own_cpu() - cpu, _cpu_of(device.pid) - device_cpu
        tracer.stop()
    finally:
        client.kill()
        client.wait()
    return _SessionRun(report["times"], report["elapsed"], cpu, device_cpu, report["cpu"], tracer.calls)


async def bench(
    seconds: float, round_trips: int, sessions: int, runner_name: str, warm_up: int, strace: bool, concurrency: int
) -> None:
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as state:
        config = ServiceConfig(
            port=0, tokens={"bench": token}, state_dir=Path(state), heartbeat_interval=5.0, log_level="warning"
        )
        runner = PlanTaskRunner() if runner_name == "plan" else None  # None: the server's default engine runner
        async with running_server(config, runner=runner) as server:
            hosts = []
            try:
                print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, server and devices on 127.0.0.1")
                hosts.append(_start_devices(server, token, "solo-", 1))
                await _wait_online(server, ["solo-0"])
                if round_trips > 0:
                    rt = await _round_trips(server, "solo-0", round_trips)
                    print(
                        f"round trip, 1 device, {len(rt)} sequential 1-command batches: "
                        f"p50 {_pct(rt, 0.5) * 1e3:.3f} ms  p99 {_pct(rt, 0.99) * 1e3:.3f} ms  "
                        f"max {max(rt) * 1e3:.3f} ms  mean {statistics.fmean(rt) * 1e3:.3f} ms"
                    )
                run = await _client_sessions(server, token, hosts[0], sessions, warm_up, strace, concurrency)
                st = run.times
                how = "sequential" if concurrency == 1 else f"{concurrency} at a time ({len(st) / run.elapsed:.0f}/s)"
                print(
                    f"session, {runner_name} runner, {len(st)} {how} (after {warm_up} not counted), each: HTTP "
                    "submit, a one-step plan run on the echo device, the session's commits and the service's "
                    f"records, long-poll until final: p50 {_pct(st, 0.5) * 1e3:.2f} ms  p90 {_pct(st, 0.9) * 1e3:.2f} ms  "
                    f"p99 {_pct(st, 0.99) * 1e3:.2f} ms  mean {statistics.fmean(st) * 1e3:.2f} ms   "
                    f"target: p50 <= 4 ms, p99 <= 15 ms (load average {os.getloadavg()[0]:.2f}; a disk's fsync "
                    "latency and other load move this figure most)"
                )
                n = len(st)
                print(
                    f"CPU per session: the server {run.server_cpu / n * 1e3:.2f} ms (this process, resource.getrusage)"
                    f"   target: <= 3 ms; the device {run.device_cpu / n * 1e3:.2f} ms (/proc); the HTTP client "
                    f"(httpx, in its own process) {run.client_cpu / n * 1e3:.2f} ms"
                )
                if run.fsyncs is not None:
                    print(
                        f"fdatasync/fsync calls of the server per session (strace -f -c): {run.fsyncs / n:.2f} "
                        "(the figures above include strace's own cost)"
                    )
                for count in (1, 10, 50) if seconds > 0 else ():
                    prefix = f"fleet{count}-"
                    ids = [f"{prefix}{i}" for i in range(count)]
                    hosts.append(_start_devices(server, token, prefix, count))
                    await _wait_online(server, ids)
                    rate = await _throughput(server, ids, seconds)
                    print(
                        f"throughput, {count:>2} devices, one closed loop each, {seconds:g} s: {rate:,.0f} commands/s"
                    )
            finally:
                for host in hosts:
                    host.kill()
                    host.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each throughput run (0: none)")
    parser.add_argument("--round-trips", type=int, default=2000, help="how many (0: none)")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument(
        "--runner", choices=("engine", "plan"), default="engine", help="which session runner the server uses"
    )
    parser.add_argument("--warm-up", type=int, default=20, help="sessions run before the counted ones, not counted")
    parser.add_argument(
        "--strace", action="store_true", help="count the server's fdatasync/fsync calls per session (strace -f -c)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="sessions submitted at once (closed loops); the targets are for 1"
    )
    parser.add_argument("--device-host", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="solo-0", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="dev-", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device_host:
        asyncio.run(_host_devices(args.device_host, os.environ["BENCH_TOKEN"], args.prefix, args.count))
    elif args.client:
        _client(args.client, args.device, args.sessions, args.warm_up, args.concurrency)
    else:
        asyncio.run(
            bench(
                args.seconds, args.round_trips, args.sessions, args.runner, args.warm_up, args.strace, args.concurrency
            )
        )


if __name__ == "__main__":
    main()
