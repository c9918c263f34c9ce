"""Artifacts and temporary files are written through the folder's descriptor (issue 27, item 7):
a symbolic link planted at a predictable name is never followed, nothing outside is touched."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.apps import Launcher
from saucer.tools.desktop.artifacts import Artifacts

SECRET = b"outside, must stay as it is\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "victim.txt"
    target.parent.mkdir()
    target.write_bytes(SECRET)
    return target


def test_a_link_at_the_old_temporary_name_is_not_followed(tmp_path: Path, outside: Path) -> None:
    artifacts = Artifacts(tmp_path / "artifacts")
    path, shown = artifacts.path("shot", "screenshot", ".png")
    # The temporary name used to be .NAME.PID.tmp: planted here, a link was followed and the target overwritten.
    os.symlink(outside, path.with_name(f".{path.name}.{os.getpid()}.tmp"))
    artifacts.write(path, b"png bytes")
    assert outside.read_bytes() == SECRET
    assert path.read_bytes() == b"png bytes" and not path.is_symlink() and shown == "shot.png"


def test_a_link_at_the_artifact_name_is_replaced_not_followed(tmp_path: Path, outside: Path) -> None:
    artifacts = Artifacts(tmp_path / "artifacts")
    path, _ = artifacts.path(None, "screenshot", ".png")
    os.symlink(outside, path)  # planted after the name was chosen (the name is predictable: a timestamp)
    artifacts.write(path, b"png bytes")
    assert outside.read_bytes() == SECRET
    assert not path.is_symlink() and path.read_bytes() == b"png bytes"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_a_folder_swapped_for_a_link_after_the_name_was_checked_is_refused(tmp_path: Path, outside: Path) -> None:
    artifacts = Artifacts(tmp_path / "artifacts")
    path, _ = artifacts.path("step-3/tree", "tree", ".json")
    shutil.rmtree(path.parent, ignore_errors=True)
    os.symlink(outside.parent, path.parent)  # the race: checked as a folder, swapped for a link before the write
    with pytest.raises(DesktopError, match="symbolic link"):
        artifacts.write(path, b"{}")
    assert sorted(p.name for p in outside.parent.iterdir()) == ["victim.txt"] and outside.read_bytes() == SECRET


def test_a_program_log_is_created_new_and_never_through_a_link(tmp_path: Path, outside: Path) -> None:
    artifacts = Artifacts(tmp_path / "artifacts")
    log, _ = artifacts.path(None, "launch-true", ".log")
    os.symlink(outside, log)
    with pytest.raises(DesktopError, match="cannot create the log"):
        Launcher().start(["true"], cwd=tmp_path, env=dict(os.environ), log=lambda: artifacts.open_log(log))
    assert outside.read_bytes() == SECRET
    fresh, _ = artifacts.path(None, "launch-echo", ".log")
    proc = Launcher().start(
        ["echo", "hello"], cwd=tmp_path, env=dict(os.environ), log=lambda: artifacts.open_log(fresh)
    )
    assert proc.wait(10) == 0 and fresh.read_text() == "hello\n"
