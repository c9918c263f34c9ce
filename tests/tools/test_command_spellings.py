"""More spellings the sensitivity prompt knows (issue 27): trap strings, util-linux wrappers, default rules.

The prompt is a courtesy (the kernel is the wall: tests/tools/test_confinement_kernel.py), but it
should still ask before the commands it can see. Each wrapper form is really run by a shell in a
scratch directory where this machine can (it must delete the file there, so the table holds real
ways of running rm), and each must be flagged sensitive by the default patterns.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from saucer.tools.rules import DEFAULT_SENSITIVE_COMMANDS, SensitivityRules, sensitive_reason

DEFAULTS = SensitivityRules.build(command_patterns=DEFAULT_SENSITIVE_COMMANDS)
ROOT = os.geteuid() == 0
X86 = platform.machine() == "x86_64"

# (form, whether it can be run here: some need root, an architecture or a program that may be missing)
WRAPPED_RM: list[tuple[str, bool]] = [
    ("trap 'rm -f victim' EXIT; echo hi", True),
    ("trap -- 'rm -f victim' EXIT INT", True),
    ("sh -c \"trap 'rm -f victim' EXIT\"", True),
    ("runuser -u root -- rm -f victim", ROOT),
    ("runuser root -c 'rm -f victim'", ROOT),
    ("su -c 'rm -f victim' root", ROOT),
    ("sg root -c 'rm -f victim'", ROOT),
    ("sg root 'rm -f victim'", ROOT),
    ("unshare -m rm -f victim", ROOT),
    ("unshare --mount --uts rm -f victim", ROOT),
    ("setarch linux64 rm -f victim", X86),
    ("setarch x86_64 rm -f victim", X86),
    ("linux64 rm -f victim", X86),
    ("chrt -o 0 rm -f victim", True),
    ("chrt --other 0 rm -f victim", True),
    ("setpriv --nnp rm -f victim", True),
    ("setpriv --reuid 0 --regid 0 --clear-groups rm -f victim", ROOT),
    ("prlimit --nofile=1024 rm -f victim", True),
    ("prlimit -n1024 rm -f victim", True),
    ("nsenter -t 1 -m rm -f victim", False),  # enters pid 1's namespaces: not run from a test
    ("nice -n 5 rm -f victim", True),
    ("ionice -c 3 rm -f victim", True),
    ("timeout -s KILL 5 rm -f victim", True),
    ("stdbuf -oL rm -f victim", True),
    ("env -u HOME rm -f victim", True),
    ("echo victim | xargs rm -f", True),
    ("find . -name victim -delete", True),
    ("find . -name victim -exec rm -f {} +", True),
    ("busybox rm -f victim", shutil.which("busybox") is not None),
    ("pkexec rm -f victim", False),  # asks an authentication agent
]

DESTRUCTIVE = [
    "chmod -R 777 dir",
    "chmod --recursive 777 dir",
    "chmod -fR 777 dir",
    "chmod -Rv u+w dir",
    "chmod 000 -R dir",
    "chmod u+x --recursive dir",
    "chown -R nobody dir",
    "chown --recursive nobody: dir",
    "chown -hR nobody dir",
    "chgrp -R nobody dir",
    "mkfs.ext4 /dev/sdb1",
    "mkfs -t xfs /dev/sdb1",
    "mke2fs -t ext4 /dev/sdb1",
    "wipefs -a /dev/sdb",
    "unlink file",
    "shred -u file",
    "truncate -s 0 file",
    "dd if=/dev/zero of=/dev/sdb bs=1M",
    "dd of=file",
    "/usr/bin/unlink file",
    "sudo wipefs -a /dev/sdb",
]

ORDINARY = ["chmod 644 file", "chmod -v u+x script.sh", "trap -p", "trap - EXIT", "trap '' INT", "echo unlink"]


@pytest.mark.parametrize("form,runnable", WRAPPED_RM, ids=[form for form, _ in WRAPPED_RM])
def test_wrapped_rm_is_flagged_sensitive(form: str, runnable: bool, tmp_path: Path) -> None:
    reason = sensitive_reason("shell.run", {"command": form}, DEFAULTS)
    assert reason is not None, form
    if not runnable:
        return
    name = form.split()[0]
    if shutil.which(name) is None and name not in ("trap", "sh", "echo", "find"):
        pytest.skip(f"{name} is not installed here")
    (tmp_path / "victim").write_text("x")
    subprocess.run(["/bin/sh", "-c", form], cwd=tmp_path, timeout=30, capture_output=True, stdin=subprocess.DEVNULL)
    assert not (tmp_path / "victim").exists(), f"{form!r} did not delete the file: not a real form of rm"


@pytest.mark.parametrize("line", DESTRUCTIVE)
def test_destructive_defaults(line: str) -> None:
    assert sensitive_reason("shell.run", {"command": line}, DEFAULTS) is not None, line


@pytest.mark.parametrize("line", ORDINARY)
def test_ordinary_lines_stay_quiet(line: str) -> None:
    assert sensitive_reason("shell.run", {"command": line}, DEFAULTS) is None, line


@pytest.mark.anyio
async def test_a_plan_without_yes_no_longer_deletes_through_these_forms(tmp_path: Path) -> None:
    """Issue 27's first finding, end to end: no --yes, no terminal, so every one of these is refused."""
    from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus, default_servers

    (tmp_path / "victim.txt").write_text("keep me")
    forms = [
        "trap 'rm -f victim.txt' EXIT; echo hi",
        "runuser -u root -- rm -f victim.txt",
        "sg root -c 'rm -f victim.txt'",
        "unshare -m rm -f victim.txt",
        "setarch linux64 rm -f victim.txt",
        "chrt -o 0 rm -f victim.txt",
        "setpriv --nnp rm -f victim.txt",
        "prlimit --nofile=64 rm -f victim.txt",
        "nsenter -t 1 -m rm -f victim.txt",
        "chmod --recursive 000 .",
        "chmod -fR 000 .",
        "chmod 000 -R .",
        "unlink victim.txt",
        "wipefs -a /dev/null",
        "mke2fs -n /dev/null",
    ]
    async with LocalCommandDispatcher.from_config(default_servers(tmp_path)) as dispatcher:
        results = [
            (await dispatcher.execute_commands([Command(tool_name="shell.run", parameters={"command": form})]))[0]
            for form in forms
        ]
    for form, result in zip(forms, results, strict=False):
        assert result.status == ResultStatus.FAILURE and "needs approval" in (result.error or ""), (form, result.error)
    assert (tmp_path / "victim.txt").read_text() == "keep me"
