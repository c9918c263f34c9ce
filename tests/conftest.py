"""The suite's two tiers and its parallel groups, set here so that a new test needs no marker of its own.

Every test gets exactly one of two markers:

- ``e2e``: the test -- or a fixture it uses, or a helper of ``tests/`` or ``scripts/`` either of them
  calls -- starts another process (``subprocess``, ``pexpect``, ``multiprocessing``, ``sys.executable``),
  a browser (playwright), a display (:class:`VirtualDesktop`) or talks to PostgreSQL (``psycopg``,
  ``SAUCER_TEST_POSTGRES_URL``, a ``postgres`` marker or parameter), or configures a stdio tool server
  (a ``"command"`` key, an ``isolated`` parameter); or it is marked ``slow``. A parametrized fixture is
  judged by the test's parameter ids (``store_url[postgresql]`` is e2e, ``[sqlite]`` not).
- ``unit``: everything else (in-process code, in-process fakes and loopback servers in a thread).

The classification reads the code objects of the test, of its fixtures and of the ``tests/``/``scripts/``
functions and classes they name (transitively): it is static, so it is decided before anything runs.
``@pytest.mark.e2e`` or ``@pytest.mark.unit`` on a test overrides it. ``make test-fast`` runs ``-m unit``.

Under pytest-xdist (``make test``: ``-n 4 --dist loadgroup``) the heavy fixtures stay on one worker each:
the desktop tests (Xvfb, GTK applications) share the group ``desktop``, the browser tests ``browser``, the
llama-server conformance test ``llama``, the queue's worker tests ``queue``; a test using another e2e
fixture wider than a function (a module's server cluster) is grouped with its module so that fixture
starts once. Grouped tests are sent first.

At the end, a newcomer's summary: what ran, and what was skipped grouped by why, each group with the one
command that enables it (instead of one ``-ra`` line per skip).
"""

from __future__ import annotations

import inspect
import os
import re
import time
import types
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_CODE = (str(ROOT / "tests") + os.sep, str(ROOT / "scripts") + os.sep)

# Names (modules, attributes, globals) whose appearance in a test's code means another process, a browser,
# a display or PostgreSQL.
SPAWNING_NAMES = frozenset(
    {
        "subprocess",
        "Popen",
        "pexpect",
        "multiprocessing",
        "ProcessPoolExecutor",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "fork",
        "forkpty",
        "posix_spawn",
        "execv",
        "execvp",
        "executable",
        "playwright",
        "sync_playwright",
        "async_playwright",
        "VirtualDesktop",
        "psycopg",
        "psycopg_pool",
    }
)
SPAWNING_MODULES = ("subprocess", "pexpect", "multiprocessing", "playwright", "psycopg", "saucer.tools.desktop.virtual")
SPAWNING_STRINGS = ("SAUCER_TEST_POSTGRES_URL", "postgresql://", "Xvfb")
STDIO_SERVER_KEY = "command"  # {"command": ..., "args": [...]}: a stdio tool server's configuration, a process
PARAM_WORDS = ("postgres", "isolated")  # in a test's parameter ids: PostgreSQL, tool servers in their own process

# xdist groups of the heavy subsystems: the first matching fixture name or path fragment names the group.
GROUPS = (
    ("desktop", ("virtual_desktop", "desktop_env"), "tests/tools/desktop/"),
    ("browser", ("browser", "page", "scene"), "tests/ui/test_ui_browser"),
    ("llama", ("llama", "llama_server"), "tests/agents/test_llm_conformance"),
    ("queue", ("workers",), "tests/queue/"),
)  # each starts several `saucer worker` processes


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: in-process test (set by tests/conftest.py): make test-fast runs these")
    config.addinivalue_line(
        "markers", "e2e: starts a process, browser, display or PostgreSQL (set by tests/conftest.py)"
    )
    if not config.pluginmanager.hasplugin("xdist"):  # tests/docs groups each page's blocks; -p no:xdist too
        config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker (no-op without xdist)")
    if not config.pluginmanager.has_plugin("saucer-newcomer-summary"):
        config.pluginmanager.register(NewcomerSummary(), "saucer-newcomer-summary")


def _own(obj: Any) -> bool:
    """Whether ``obj`` is a function or class defined in this repository's tests/ or scripts/."""
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:
        return False
    return bool(path) and os.path.abspath(path).startswith(OWN_CODE)


def _codes(obj: Any) -> Iterator[tuple[types.CodeType, dict[str, Any]]]:
    """The code objects of a function, or of every method and property of a class, with their globals."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(obj, types.FunctionType):
        yield obj.__code__, obj.__globals__
    elif isinstance(obj, type):
        for value in vars(obj).values():
            if isinstance(value, property):
                value = value.fget
            if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
                yield from _codes(value)


def _flat(consts: tuple[Any, ...]) -> Iterator[Any]:
    """Constants, with those inside tuples and frozensets (a dict literal's keys are one tuple)."""
    for const in consts:
        if isinstance(const, (tuple, frozenset)):
            yield from _flat(tuple(const))
        else:
            yield const


class _Classifier:
    """Memoised reachability of spawning names from code objects of tests/ and scripts/."""

    def __init__(self) -> None:
        self.seen: dict[int, bool] = {}

    def spawns(self, obj: Any) -> bool:
        key = id(obj)
        if key not in self.seen:
            self.seen[key] = False  # a cycle (recursive helpers) adds nothing
            self.seen[key] = any(self._code_spawns(code, glb) for code, glb in _codes(obj))
        return self.seen[key]

    def _code_spawns(self, code: types.CodeType, glb: dict[str, Any]) -> bool:
        if SPAWNING_NAMES.intersection(code.co_names):
            return True
        for const in _flat(code.co_consts):
            if isinstance(const, types.CodeType) and self._code_spawns(const, glb):
                return True
            if isinstance(const, str) and (const == STDIO_SERVER_KEY or any(s in const for s in SPAWNING_STRINGS)):
                return True
        for name in code.co_names:
            value = glb.get(name)
            if value is None:
                continue
            if isinstance(value, types.ModuleType):
                if value.__name__.startswith(SPAWNING_MODULES):
                    return True
                if _own(value):  # a helper module of tests/ or scripts/: the attributes this code names in it
                    used = (getattr(value, attr, None) for attr in code.co_names)
                    if any(isinstance(v, (types.FunctionType, type)) and _own(v) and self.spawns(v) for v in used):
                        return True
                continue
            module = getattr(value, "__module__", None) or ""
            if module.startswith(SPAWNING_MODULES):
                return True
            if (isinstance(value, (types.FunctionType, type)) and _own(value)) and self.spawns(value):
                return True
        return False


def _fixturedefs(item: pytest.Item) -> Iterator[Any]:
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        yield from defs


def _is_e2e(item: pytest.Item, classifier: _Classifier) -> bool:
    if item.get_closest_marker("slow") or item.get_closest_marker("postgres"):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(word in callspec.id.lower() for word in PARAM_WORDS):
        return True
    function = getattr(item, "function", None)
    if function is not None and classifier.spawns(function):
        return True
    for fixturedef in _fixturedefs(item):
        if fixturedef.params is not None:
            continue  # judged by its parameter above
        if _own(fixturedef.func) and classifier.spawns(fixturedef.func):
            return True
    return False


def _group(item: pytest.Item, classifier: _Classifier) -> str | None:
    names = set(getattr(item, "fixturenames", ()))
    for group, fixtures, path in GROUPS:
        if names.intersection(fixtures) or path in item.nodeid:
            return group
    for fixturedef in _fixturedefs(item):
        if fixturedef.scope != "function" and _own(fixturedef.func) and classifier.spawns(fixturedef.func):
            return item.nodeid.split("::")[0]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test ``unit`` or ``e2e``; under xdist, group the heavy ones and send those first."""
    classifier = _Classifier()
    xdist = config.pluginmanager.hasplugin("xdist")  # its marker exists only with the plugin (-p no:xdist)
    grouped: list[pytest.Item] = []
    for item in items:
        forced = item.get_closest_marker("e2e") or item.get_closest_marker("unit")
        e2e = forced.name == "e2e" if forced else _is_e2e(item, classifier)
        item.add_marker("e2e" if e2e else "unit")
        group = _group(item, classifier) if e2e else None
        if group is not None and xdist and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("xdist_group"):
            grouped.append(item)
    if os.environ.get("PYTEST_XDIST_WORKER") and grouped:
        # The longest groups start first so they do not finish last; every worker orders the same way.
        chosen = {id(item) for item in grouped}
        items[:] = grouped + [item for item in items if id(item) not in chosen]


# ------------------------------------------------------------ the closing summary

#: What a skip reason needs -> (group name, the one command that enables the group).
ENABLERS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"SAUCER_TEST_POSTGRES_URL"),
        "PostgreSQL",
        "export SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test",
    ),
    (
        re.compile(r"SAUCER_TEST_LLAMA_CPP_PYTHON"),
        "llama-cpp-python's own server (opt-in: a python with llama-cpp-python[server], a ~10 min build)",
        "export SAUCER_TEST_LLAMA_CPP_PYTHON=/path/to/that/python",
    ),
    (
        re.compile(r"make llama-server|llama-server"),
        "llama-server and its model (cached, ~20 min once on 2 cores)",
        "make llama-server",
    ),
    (re.compile(r"chromium", re.I), "Debian's Chromium (the viewer's browser tests)", "apt-get install -y chromium"),
    (re.compile(r"(apt-get install -y [\w .+-]+)"), "Debian packages (the desktop tests)", ""),
)
#: Where the duration of the last whole-suite run is kept (pytest's cache), to say what to expect next time.
DURATION_KEY = "saucer/whole-suite-minutes"


def _skip_group(reason: str) -> tuple[str, str]:
    for pattern, name, command in ENABLERS:
        found = pattern.search(reason)
        if found:
            return name, command or found.group(1).strip()
    return "other reasons", ""


class NewcomerSummary:
    """Counts outcomes and groups skips by what enables them; prints one screen at the end."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.outcomes: Counter[str] = Counter()
        self.skips: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped:
            reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            self.skips[_skip_group(reason)][reason] += 1
            self.outcomes["skipped"] += 1
        elif report.when == "call" or report.failed:
            self.outcomes["passed" if report.passed else "failed"] += 1

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        tr = terminalreporter
        elapsed = time.monotonic() - self.started
        tr.section("what ran, what was skipped", sep="=")
        whole = not config.args or [str(a).rstrip("/") for a in config.args] == ["tests"]
        cache = getattr(config, "cache", None)
        last = cache.get(DURATION_KEY, None) if cache is not None else None
        expected = (
            f"the last whole run here took {last:.1f} min"
            if isinstance(last, (int, float))
            else "a whole run takes tens of minutes on a busy 2-core machine; the next summary says how long the last one took"
        )
        tr.write_line(
            f"{self.outcomes['passed']} passed, {self.outcomes['failed']} failed or errored, "
            f"{self.outcomes['skipped']} skipped in {elapsed / 60:.1f} min (expected: {expected})"
        )
        if whole and cache is not None and self.outcomes["passed"]:
            cache.set(DURATION_KEY, round(elapsed / 60, 1))
        for (name, command), reasons in sorted(self.skips.items(), key=lambda item: -sum(item[1].values())):
            tr.write_line(
                f"  {sum(reasons.values()):4d} skipped: needs {name}"
                if command
                else f"  {sum(reasons.values()):4d} skipped: {name}"
            )
            if command:
                tr.write_line(f"       enable with: {command}")
            else:
                for reason, count in reasons.most_common(5):
                    tr.write_line(f"       {count} x {reason[:150]}")
        if self.skips:
            tr.write_line(
                "  more: make test ARGS='-rs' lists every skip; ARGS='tests/cli -x' runs one folder (docs/contributing.md)"
            )
