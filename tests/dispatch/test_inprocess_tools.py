"""The built-in tools in-process (the default) and isolated (stdio): the same behaviour either way.

In-process they share the host's event loop and process, so on top of the
shared checks: blocking work runs off the loop, a call that never returns
times out and does not keep the process alive, the host's environment and
logging stay the host's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus, default_servers

pytestmark = pytest.mark.anyio

MODES = pytest.mark.parametrize("isolate", [False, True], ids=["inprocess", "isolated"])


def _servers(root: Path, isolate: bool, **timeouts: float) -> dict[str, Any]:
    servers = default_servers(root, isolate=isolate)
    return {
        name: config.model_copy(update={"timeout": timeouts[name]}) if name in timeouts else config
        for name, config in servers.items()
    }


async def _one(dispatcher: LocalCommandDispatcher, tool: str, **parameters: Any) -> Any:
    [result] = await dispatcher.execute_commands([Command(tool_name=tool, parameters=parameters)])
    return result


@MODES
async def test_the_same_rules_hold_either_way(tmp_path: Path, isolate: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sandbox, sensitive commands, hostile input and the environment, over one dispatcher per mode."""
    (tmp_path / "keep.txt").write_text("precious\n")
    monkeypatch.setenv("SAUCER_LLM_API_KEY", "sk-do-not-leak")
    async with LocalCommandDispatcher.from_config(default_servers(tmp_path, isolate=isolate)) as dispatcher:
        tools = await dispatcher.list_tools()
        assert {"shell.run", "files.read", "files.write", "files.search"} <= set(tools)
        # The sandbox.
        escape = await _one(dispatcher, "files.read", path="../outside.txt")
        assert escape.status == ResultStatus.FAILURE and "escapes the sandbox root" in escape.error
        cwd = await _one(dispatcher, "shell.run", command="pwd", cwd="..")
        assert cwd.status == ResultStatus.FAILURE and "cwd refused" in cwd.error
        # Sensitive commands need approval.
        refused = await _one(dispatcher, "shell.run", command="rm keep.txt")
        assert refused.status == ResultStatus.FAILURE and "needs approval" in refused.error
        assert (tmp_path / "keep.txt").read_text() == "precious\n"
        # 5,000 nested groups (a RecursionError in Python's re) are compiled by RE2 without recursion: answered.
        deep = await _one(dispatcher, "files.search", pattern="(" * 5000 + "e" + ")" * 5000, regex=True)
        assert deep.status == ResultStatus.SUCCESS and deep.result["matches"][0]["path"] == "keep.txt"
        nested: list[Any] = []
        for _ in range(100_000):
            nested = [nested]
        hostile = await _one(dispatcher, "files.read", path="keep.txt", offset=nested)
        assert hostile.status == ResultStatus.FAILURE
        found = await _one(dispatcher, "files.search", pattern="precious")
        assert found.status == ResultStatus.SUCCESS and found.result["matches"][0]["path"] == "keep.txt"
        # Commands start from a minimal environment, never the host's secrets.
        env = await _one(dispatcher, "shell.run", command="env")
        names = {line.split("=", 1)[0] for line in env.result["stdout"].splitlines()}
        assert "SAUCER_LLM_API_KEY" not in names and "sk-do-not-leak" not in env.result["stdout"]
        assert {"HOME", "PATH"} <= names
        # Where the tools run: in-process the shell's parent is this process; isolated, the server's.
        parent = await _one(dispatcher, "shell.run", command="echo $PPID")
        assert (int(parent.result["stdout"]) == os.getpid()) is not isolate


@MODES
async def test_a_command_past_the_timeout_fails_and_its_group_is_killed(tmp_path: Path, isolate: bool) -> None:
    async with LocalCommandDispatcher.from_config(_servers(tmp_path, isolate, shell=1.0)) as dispatcher:
        slow = await _one(dispatcher, "shell.run", command="echo $$ > pid; exec sleep 60")
        assert slow.status == ResultStatus.FAILURE and "timed out after 1 s" in slow.error
        pid = int((tmp_path / "pid").read_text())
        # The cancelled call stops the command's process group (SIGTERM, then SIGKILL after a grace period).
        for _ in range(200):
            if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the timed-out command (pid {pid}) is still running")
        after = await _one(dispatcher, "shell.run", command="echo next")
        assert after.result["stdout"] == "next\n"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


async def test_blocking_file_work_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from saucer.tools.files import FileTools

    released = threading.Event()
    original = FileTools.stat

    def blocked_stat(self: FileTools, path: str) -> Any:
        # Waits for a shell command to finish: possible only while the loop keeps running.
        if not released.wait(30):
            raise RuntimeError("the event loop was blocked while a file operation ran")
        return original(self, path)

    monkeypatch.setattr(FileTools, "stat", blocked_stat)
    async with LocalCommandDispatcher.from_config(default_servers(tmp_path)) as dispatcher:
        await dispatcher.start()

        async def release_after_a_command() -> Any:
            result = await _one(dispatcher, "shell.run", command="echo done")
            released.set()
            return result

        stat, echo = await asyncio.gather(_one(dispatcher, "files.stat", path="."), release_after_a_command())
        assert echo.result["stdout"] == "done\n"
        assert stat.status == ResultStatus.SUCCESS and stat.result["type"] == "directory"


def test_a_hung_call_times_out_and_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys, threading
        from pathlib import Path
        from saucer.dispatch import Command, LocalCommandDispatcher, default_servers
        from saucer.tools.files import FileTools

        FileTools.read = lambda self, *args: threading.Event().wait()  # never returns

        async def main():
            servers = default_servers(Path(sys.argv[1]))
            servers["files"] = servers["files"].model_copy(update={"timeout": 0.5})
            async with LocalCommandDispatcher.from_config(servers) as dispatcher:
                [hung] = await dispatcher.execute_commands([Command(tool_name="files.read", parameters={"path": "x"})])
                [listed] = await dispatcher.execute_commands([Command(tool_name="files.list")])
                print(hung.status.value, hung.error)
                print(listed.status.value)

        asyncio.run(main())
        print("exiting")
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "failure tool 'files.read' timed out after 0.5 s"
    assert lines[1:] == ["success", "exiting"]


async def test_in_process_servers_leave_the_hosts_logging_alone(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    async with LocalCommandDispatcher.from_config(default_servers(tmp_path)) as dispatcher:
        assert await dispatcher.list_tools()
    assert (list(root.handlers), root.level) == before


async def test_options_name_a_factory_and_bad_ones_are_start_errors(tmp_path: Path) -> None:
    servers = {
        "files": {"import_path": "saucer.tools.files:create_server", "options": {"root": str(tmp_path)}},
        "bad": {"import_path": "saucer.tools.files:create_server", "options": {"root": str(tmp_path / "none")}},
        "typo": {"import_path": "saucer.tools.files:create_server", "options": {"rooot": "."}},
    }
    async with LocalCommandDispatcher.from_config(servers) as dispatcher:
        errors = await dispatcher.start()
        assert set(errors) == {"bad", "typo"}
        assert "is not a directory" in errors["bad"]
        assert "unexpected keyword argument 'rooot'" in errors["typo"]
        listing = await _one(dispatcher, "files.list")
        assert listing.status == ResultStatus.SUCCESS


@MODES
def test_commands_die_with_a_host_killed_outright(tmp_path: Path, isolate: bool) -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        from pathlib import Path
        from saucer.dispatch import Command, LocalCommandDispatcher, default_servers

        async def main():
            servers = default_servers(Path(sys.argv[1]), isolate=sys.argv[2] == "1")
            async with LocalCommandDispatcher.from_config(servers) as dispatcher:
                await dispatcher.execute_commands([Command(
                    tool_name="shell.run",
                    parameters={"command": "echo $$ > pgid; touch started; sleep 2; echo finished > done"})])

        asyncio.run(main())
        """
    )
    argv = [sys.executable, "-c", script, str(tmp_path), "1" if isolate else "0"]
    _kill_host_once(argv, tmp_path / "started", "the command did not start")
    # Stopped within the watchdog's grace period (isolated: by the shell server, which sees its client gone).
    _wait_group_gone(int((tmp_path / "pgid").read_text()), "the command's process group")
    time.sleep(2.5)  # as long as the command would still have run
    assert not (tmp_path / "done").exists()


def _kill_host_once(argv: list[str], ready: Path, not_ready: str, before: Any = None) -> None:
    """Start the host ``argv``, wait for the file ``ready``, run ``before``, then SIGKILL the host."""
    host = subprocess.Popen(argv)
    try:
        for _ in range(1200):
            if ready.exists() or host.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), not_ready
        if before is not None:
            before()
        host.send_signal(signal.SIGKILL)
        host.wait(30)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(30)


def _wait_group_gone(pgid: int, what: str) -> None:
    for _ in range(200):
        if not _group_alive(pgid):
            return
        time.sleep(0.05)
    pytest.fail(f"{what} {pgid} outlived its host")


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def test_a_host_killed_before_it_announces_a_command_never_starts_it(tmp_path: Path) -> None:
    # The window between starting a command's group and announcing it to the watchdog, held open:
    # the command waits at its gate, and a host dying there leaves nothing behind.
    script = textwrap.dedent(
        """
        import asyncio, sys, time
        from pathlib import Path
        import saucer.tools.shell_run as shell
        from saucer.dispatch import Command, LocalCommandDispatcher, default_servers

        def held_announcement(pgid):
            Path(sys.argv[1], "pgid").write_text(str(pgid))
            time.sleep(60)

        shell.watch_group = held_announcement

        async def main():
            async with LocalCommandDispatcher.from_config(default_servers(Path(sys.argv[1]))) as dispatcher:
                await dispatcher.execute_commands([Command(
                    tool_name="shell.run", parameters={"command": "touch started; sleep 2; echo finished > done"})])

        asyncio.run(main())
        """
    )

    def still_gated() -> None:
        time.sleep(0.5)  # time enough for an ungated command to get going
        assert not (tmp_path / "started").exists()

    argv = [sys.executable, "-c", script, str(tmp_path)]
    _kill_host_once(argv, tmp_path / "pgid", "the command's group was not started", still_gated)
    _wait_group_gone(int((tmp_path / "pgid").read_text()), "the gated command's group")
    assert not (tmp_path / "started").exists() and not (tmp_path / "done").exists()
