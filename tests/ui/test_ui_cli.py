"""``saucer ui`` as a user runs it: its refusals, and a real server answering."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from tests.support.ui import write_session

from saucer.store import open_store

SAUCER = [sys.executable, "-m", "saucer"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")} | {"COLUMNS": "200", "NO_COLOR": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refusals_are_one_line(tmp_path: Path) -> None:
    memory = subprocess.run(
        [*SAUCER, "ui", "--store", "memory://x"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert (
        memory.returncode == 2
        and "memory:// store lives in one process" in memory.stderr
        and "Traceback" not in memory.stderr
    )
    with open_store(f"sqlite:///{tmp_path}/s.db") as st:
        write_session(st, "s")
    exposed = subprocess.run(
        [*SAUCER, "ui", "--host", "0.0.0.0", "--store", f"sqlite:///{tmp_path}/s.db"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert exposed.returncode == 2 and "SAUCER_SERVICE_TOKENS" in exposed.stderr
    missing = subprocess.run([*SAUCER, "ui"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no saucer store" in missing.stderr


def test_a_real_viewer_serves_the_store_and_asks_for_a_token_off_loopback(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as st:
        write_session(st, "seen-here")
    port = _free_port()
    token = "viewer-token-0123456789"
    proc = subprocess.Popen(
        [*SAUCER, "ui", "seen", "--host", "0.0.0.0", "--port", str(port), "--store", url],
        cwd=tmp_path,
        env=_env() | {"SAUCER_SERVICE_TOKENS": f"viewer={token}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/sessions/seen-here", headers={"Authorization": f"Bearer {token}"}
                )
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.2)
        assert answer.status_code == 200 and "seen-here" in answer.text
        assert httpx.get(f"http://127.0.0.1:{port}/sessions").status_code == 303
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # Ctrl-C stops the viewer: not an error
    assert "/sessions/seen-here" in err and "token required" in err and token not in err
