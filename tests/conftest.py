"""The closing summary of ``make test`` for a newcomer: what ran, and what was skipped grouped by
why, each group with the one command that enables it (instead of one ``-ra`` line per skip)."""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from typing import Any

import pytest

#: What a skip reason needs -> (group name, the one command that enables the group).
ENABLERS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"SAUCER_TEST_POSTGRES_URL"), "PostgreSQL",
     "export SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test"),
    (re.compile(r"make llama-server|llama-server"), "llama-server and its model (cached, ~20 min once on 2 cores)",
     "make llama-server"),
    (re.compile(r"chromium", re.I), "Debian's Chromium (the viewer's browser tests)", "apt-get install -y chromium"),
    (re.compile(r"(apt-get install -y [\w .+-]+)"), "Debian packages (the desktop tests)", ""),
)
#: Where the duration of the last whole-suite run is kept (pytest's cache), to say what to expect next time.
DURATION_KEY = "saucer/whole-suite-minutes"


def _group(reason: str) -> tuple[str, str]:
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
            self.skips[_group(reason)][reason] += 1
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
        expected = (f"the last whole run here took {last:.1f} min" if isinstance(last, (int, float))
                    else "a whole run takes tens of minutes on a busy 2-core machine; the next summary says how long the last one took")
        tr.write_line(f"{self.outcomes['passed']} passed, {self.outcomes['failed']} failed or errored, "
                      f"{self.outcomes['skipped']} skipped in {elapsed / 60:.1f} min (expected: {expected})")
        if whole and cache is not None and self.outcomes["passed"]:
            cache.set(DURATION_KEY, round(elapsed / 60, 1))
        for (name, command), reasons in sorted(self.skips.items(), key=lambda item: -sum(item[1].values())):
            tr.write_line(f"  {sum(reasons.values()):4d} skipped: needs {name}" if command else
                          f"  {sum(reasons.values()):4d} skipped: {name}")
            if command:
                tr.write_line(f"       enable with: {command}")
            else:
                for reason, count in reasons.most_common(5):
                    tr.write_line(f"       {count} x {reason[:150]}")
        if self.skips:
            tr.write_line("  more: make test ARGS='-rs' lists every skip; ARGS='tests/cli -x' runs one folder (README, Tests)")


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("saucer-newcomer-summary"):
        config.pluginmanager.register(NewcomerSummary(), "saucer-newcomer-summary")
