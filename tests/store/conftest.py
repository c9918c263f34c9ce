"""``store_url``: every backend the contract suite runs against.

- ``memory://NAME`` (a fresh name per test; stores opened with it share data)
- ``sqlite:///<tmp_path>/x.db``
- ``postgresql://...?schema=t_<random>`` when ``SAUCER_TEST_POSTGRES_URL`` is
  set: a schema of its own per test, dropped afterwards. Unset, the PostgreSQL
  leg is skipped, except under ``CI=true`` where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The contract suite lives in the package (a third-party backend runs it too):
# let pytest show the values of its failing asserts.
pytest.register_assert_rewrite("saucer.store.testing")

POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"
POSTGRES_HINT = f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test to run the PostgreSQL tests"


def _with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL for an empty store of each backend."""
    kind = request.param
    if kind == "memory":
        yield f"memory://contract-{uuid.uuid4().hex}"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path}/x.db"
    else:
        url = os.environ.get(POSTGRES_ENV)
        if not url:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{POSTGRES_ENV} is not set under CI=true; {POSTGRES_HINT}")
            pytest.skip(POSTGRES_HINT)
        import psycopg
        from psycopg import sql

        schema = "t_" + uuid.uuid4().hex[:12]
        try:
            yield _with_schema(url, schema)
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
