"""Decompression is capped (issue 27, item 3): a small stored record that inflates to 1 GiB
is a damaged record (CorruptRecordError, a StoreError), never a MemoryError.

The end-to-end case runs in a child process whose address space is limited to
768 MiB: without the cap, inflating the record alone fails with MemoryError.
"""

from __future__ import annotations

import base64
import sqlite3
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from saucer.context import Context
from saucer.context.events import Packed
from saucer.store import CorruptRecordError, StoreError, open_store
from saucer.store.inflate import MAX_INFLATED_BYTES, InflateError, RecordTooLargeError, check_record_size, inflate


def _bomb(size: int = 1 << 30) -> bytes:
    """A zlib stream of ``size`` bytes of JSON-ish text, compressed chunk by chunk (never held whole)."""
    packer = zlib.compressobj(1)
    chunk = b" " * (1 << 20)
    parts = [packer.compress(b"{")]
    parts += [packer.compress(chunk) for _ in range(size >> 20)]
    return b"".join([*parts, packer.flush()])


BOMB = _bomb()


def test_inflate_stops_at_its_cap_and_at_the_global_limit() -> None:
    assert inflate(zlib.compress(b"x" * 5000), 5000) == b"x" * 5000
    with pytest.raises(InflateError, match="more than 4,999 bytes"):
        inflate(zlib.compress(b"x" * 5000), 4999)
    with pytest.raises(InflateError, match=f"more than {MAX_INFLATED_BYTES:,} bytes"):
        inflate(BOMB)
    with pytest.raises(RecordTooLargeError, match="nothing was written"):
        check_record_size(MAX_INFLATED_BYTES + 1, "an event")


def test_a_packed_value_never_inflates_past_its_declared_size() -> None:
    packed = Packed(base64.b64encode(BOMB).decode("ascii"), 163, where=("s", 7))
    with pytest.raises(CorruptRecordError, match="session 's'.*version 7.*more than 163 bytes"):
        packed.decode("STRUCTURAL_LOGS")
    with pytest.raises(CorruptRecordError):
        packed.whole_json()


def test_a_bomb_in_the_store_is_a_store_error_under_a_memory_limit(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as store:
        ctx = Context.open(store, "s")
        for i in range(3):
            ctx.update_vars({"out": "line of output\n" * (100 + i)})
            ctx.commit()
        ctx.close()
    (tmp_path / "bomb.bin").write_bytes(BOMB)
    assert len(BOMB) < 5 * 1024 * 1024  # a few MB on disk
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE events_recent SET payload = ?, crc = ? WHERE version = 2", (BOMB, zlib.crc32(BOMB)))
    script = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))
        from saucer.store import StoreError, open_store
        try:
            with open_store("sqlite:///{path}") as store:
                list(store.read("s"))
        except StoreError as exc:
            print(type(exc).__name__, exc)
            sys.exit(3)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout.startswith("CorruptRecordError") and "more than" in done.stdout and "version 2" in done.stdout
    with open_store(f"sqlite:///{path}") as store:
        with pytest.raises(StoreError):
            list(store.read("s"))
        assert [e.version for e in store.read("s", 0, 1)] == [1]
