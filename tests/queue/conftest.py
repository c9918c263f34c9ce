"""Fixtures of the queue tests: a PostgreSQL schema per test, the test's directory, saucer and worker processes.

The queue needs PostgreSQL: without ``SAUCER_TEST_POSTGRES_URL`` these tests
skip, except under ``CI=true`` where that is a failure. Each test gets a store
schema ``q_<random>`` (its queue is ``q_<random>_queue``); both are dropped afterwards.
Helpers live in :mod:`tests.support.queueing`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.queueing import CONFIG, SAUCER, queue_env

POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"
POSTGRES_HINT = f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test to run the queue tests"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A store URL with a schema of its own (and its queue schema), dropped after the test."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{POSTGRES_ENV} is not set under CI=true; {POSTGRES_HINT}")
        pytest.skip(POSTGRES_HINT)
    import psycopg
    from psycopg import sql

    schema = "q_" + uuid.uuid4().hex[:12]
    try:
        yield f"{url}{'&' if '?' in url else '?'}schema={schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for name in (schema, f"{schema}_queue"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def qdir(tmp_path: Path) -> Path:
    """The working directory of the test's saucer processes (with its saucer.toml)."""
    (tmp_path / "saucer.toml").write_text(CONFIG, encoding="utf-8")
    return tmp_path


@pytest.fixture
def saucer(qdir: Path, pg_url: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``saucer ARGS`` to its end in the test's directory (``env``: extra settings)."""

    def run(*args: str, timeout: float = 60, env: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SAUCER, *args],
            cwd=qdir,
            env=queue_env(pg_url, **(env or {})),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def workers(qdir: Path, pg_url: str) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``saucer worker`` processes; the ones still running at the end are killed."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, Any] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [*SAUCER, "worker", *args],
            cwd=qdir,
            env=queue_env(pg_url, **(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
