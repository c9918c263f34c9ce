"""The server's identity file is written as a new file, never through a link planted at its temporary name."""

from __future__ import annotations

import os
from pathlib import Path

from saucer.service.engine_runner import server_identity

SECRET = b"outside, must stay as it is\n"


def test_the_server_identity_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    outside = tmp_path / "victim.txt"
    outside.write_bytes(SECRET)
    state = tmp_path / "state"
    state.mkdir()
    os.symlink(outside, state / f".server-id.{os.getpid()}.tmp")  # the temporary name it used to write through
    identity = server_identity(state)
    assert outside.read_bytes() == SECRET and identity == server_identity(state)
