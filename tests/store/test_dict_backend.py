"""The whole public contract suite (:mod:`saucer.store.testing`) against a backend written in the
tests on the backend contract alone (``dict_backend.py``), and the suite's failing asserts shown
with their values under the documented recipe."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from dict_backend import DictStore, Tables

from saucer.store import EventStore, Feature, NotSupportedError
from saucer.store.testing import EventStoreContract


class TestDictStore(EventStoreContract):
    @pytest.fixture
    def store_factory(self) -> Callable[[], EventStore]:
        tables = Tables()
        return lambda: DictStore(tables)


def test_the_dict_backend_declares_nothing_optional_and_is_refused_it() -> None:
    store = DictStore()
    store.create_session("s")
    assert store.features == frozenset()
    for call in (
        lambda: store.replace_history("s", 1, [], {}),
        lambda: store.record_formats("s"),
        lambda: store.import_log(store.session_info("s"), []),
    ):
        with pytest.raises(NotSupportedError):
            call()
    assert Feature.IMPORT not in store.features


def test_a_failing_assert_of_the_suite_shows_its_values_under_the_documented_recipe(tmp_path: Path) -> None:
    # The recipe of saucer.store.testing, with a backend whose listings are wrong, in a folder of
    # its own (no conftest registering anything): the failure must show the compared values.
    (tmp_path / "test_broken.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from saucer.store.testing import EventStoreContract
            from dict_backend import DictStore, Tables

            class Forgetful(DictStore):
                def kept_counters(self, session_id):
                    counters = super().kept_counters(session_id)
                    return None if counters is None else counters.__class__(counters.status, 41)

            class TestBroken(EventStoreContract):
                @pytest.fixture
                def store_factory(self):
                    tables = Tables()
                    return lambda: Forgetful(tables)
            """
        )
    )
    (tmp_path / "dict_backend.py").write_text((Path(__file__).parent / "dict_backend.py").read_text())
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "-x",
            "-k",
            "test_commits_keep_each_sessions_summary",
            "test_broken.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "AssertionError" in run.stdout and "assert (41, 0, 0.0, None) == (3, 3, 0.75, 'round 3 ok')" in run.stdout, (
        run.stdout
    )
