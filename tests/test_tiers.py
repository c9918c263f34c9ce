"""tests/conftest.py's tiers: a test that reaches a process, a browser, a display or PostgreSQL is e2e, others unit."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("saucer_test_tiers", Path(__file__).with_name("conftest.py"))
assert _spec is not None and _spec.loader is not None
tiers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiers)


def _starts_a_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)


def _through_a_helper() -> None:
    _starts_a_process()


class _Launcher:
    def launch(self) -> None:
        _through_a_helper()


def _uses_the_launcher() -> None:
    _Launcher().launch()


def _postgres() -> str | None:
    return os.environ.get("SAUCER_TEST_POSTGRES_URL")


def _stdio_server() -> dict[str, object]:
    return {"command": "mcp-server-time", "args": []}


def _imports_psycopg() -> None:
    import psycopg  # noqa: F401


def _pure(x: int) -> int:
    return sorted([x, 1])[0] + len(os.sep)


def _recursive(n: int) -> int:
    return 0 if n <= 0 else _recursive(n - 1)


@pytest.mark.parametrize(
    "function",
    [_starts_a_process, _through_a_helper, _uses_the_launcher, _postgres, _stdio_server, _imports_psycopg],
)
def test_what_reaches_a_process_or_postgres_is_e2e(function: object) -> None:
    assert tiers._Classifier().spawns(function)


@pytest.mark.parametrize("function", [_pure, _recursive])
def test_in_process_code_is_unit(function: object) -> None:
    assert not tiers._Classifier().spawns(function)


def test_this_test_is_marked_unit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") and not request.node.get_closest_marker("e2e")
    assert not request.node.get_closest_marker("xdist_group")


def test_this_test_starts_a_process_and_is_marked_e2e(request: pytest.FixtureRequest) -> None:
    _starts_a_process()
    assert request.node.get_closest_marker("e2e") and not request.node.get_closest_marker("unit")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_parameter_naming_postgres_makes_e2e(request: pytest.FixtureRequest, store: str) -> None:
    expected = "e2e" if store == "postgresql" else "unit"
    assert request.node.get_closest_marker(expected)


@pytest.mark.e2e
def test_an_explicit_marker_wins(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("e2e") and not request.node.get_closest_marker("unit")


def test_the_desktop_tests_share_one_worker_group() -> None:
    [desktop] = [group for group in tiers.GROUPS if group[0] == "desktop"]
    assert "virtual_desktop" in desktop[1] and Path(desktop[2]).parts == ("tests", "tools", "desktop")
