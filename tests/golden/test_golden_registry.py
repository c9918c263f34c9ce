"""The golden-store check still passes once a name its sessions wrote is retired
or renamed: the expected states are mapped through the registry the code reads
with (``saucer.context.names.RENAMED`` / ``RETIRED``), never by editing a label."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import test_golden_stores as golden_test

from saucer.context import events as events_module
from saucer.context import names as names_module
from saucer.store import open_store

SQLITE_LABEL = next(label for label in golden_test.LABELS if label.name.endswith("-sqlite-schema2"))


def test_every_golden_state_reads_the_same_with_a_name_retired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "APPLICATION_ROOT_NAME"  # written by 'names-all' and the engine sessions
    monkeypatch.delitem(events_module._NAMES, name)
    monkeypatch.delitem(names_module._BY_KEY, name)
    monkeypatch.setitem(names_module.RETIRED, name, "retired in a later saucer")
    expected = golden_test.expected_of(SQLITE_LABEL)
    copy = tmp_path / "store.db"
    shutil.copyfile(SQLITE_LABEL / expected["store_file"], copy)
    with open_store(f"sqlite:///{copy}") as store, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torn tail's warning is checked by the golden test itself
        assert golden_test._check_states(golden_test.Golden(store.url, expected, store)) == []


@pytest.mark.parametrize("label", golden_test.LABELS, ids=lambda label: label.name)
def test_every_golden_state_reads_the_same_after_migrate_rewrite(label: Path, tmp_path: Path) -> None:
    """``saucer store migrate --rewrite`` stores every old record again in the newest format: nothing reads differently."""
    import os

    from saucer.store.maintenance import format_census, rewrite_old_records
    from saucer.store.upcast import FORMAT_VERSION

    expected = golden_test.expected_of(label)
    if expected["backend"] == "sqlite":
        copy = tmp_path / "store.db"
        shutil.copyfile(label / expected["store_file"], copy)
        url, cleanup = f"sqlite:///{copy}", None
    else:
        base = os.environ.get(golden_test.POSTGRES_ENV)
        if not base:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{golden_test.POSTGRES_ENV} is not set under CI=true")
            pytest.skip(golden_test.POSTGRES_HINT)
        import uuid

        import golden_format as gf

        schema = "t_golden_rw_" + uuid.uuid4().hex[:10]
        gf.restore_dump(
            base, (label / expected["store_file"]).read_text(encoding="utf-8"), expected["dump_schema"], schema
        )
        url = gf.with_schema(base, schema)

        def cleanup() -> None:
            import psycopg

            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    try:
        with open_store(url) as store, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Labels written before record formats existed carry no record_format: all their records are old.
            written_in = expected["written_by"].get("record_format", 1)
            assert any(c.old for c in format_census(store)) == (written_in < FORMAT_VERSION)
            rewritten = rewrite_old_records(store)
            assert (rewritten > 0) == (written_in < FORMAT_VERSION)
            census = format_census(store)
            assert not any(c.old for c in census)
            assert {v for c in census for v in c.events} == {FORMAT_VERSION}
            assert rewrite_old_records(store) == 0  # a second run finds nothing left
            assert golden_test._check_states(golden_test.Golden(store.url, expected, store)) == []
    finally:
        if cleanup is not None:
            cleanup()
