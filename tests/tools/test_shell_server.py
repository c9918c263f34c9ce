"""The built-in shell server: results, timeout, output cap, rules, sandboxed cwd, stdio and --help."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, Result, ResultStatus, default_servers
from saucer.tools.shell import ShellOptions, build_server, parse_options

pytestmark = pytest.mark.anyio


async def _run(options: ShellOptions, *commands: Command, parallel: bool = False) -> list[Result]:
    async with LocalCommandDispatcher.from_servers(
        {"shell": build_server(options)}, parallel_data_collection=parallel
    ) as dispatcher:
        return await dispatcher.execute_commands(list(commands))


def _shell(command: str, **parameters: object) -> Command:
    return Command(tool_name="shell.run", parameters={"command": command, **parameters})


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (no reaper in some containers) is dead too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


async def test_exit_code_stdout_and_stderr(tmp_path: Path) -> None:
    [ok, failing, after] = await _run(
        ShellOptions.create(tmp_path),
        _shell("echo out; echo err >&2; pwd"),
        _shell("echo partial; echo oops >&2; exit 3"),
        _shell("echo never"),
    )
    assert ok.status == ResultStatus.SUCCESS and ok.namespace == "shell"
    assert ok.result["exit_code"] == 0 and ok.result["stderr"] == "err\n"
    assert ok.result["stdout"] == f"out\n{tmp_path.resolve()}\n" and ok.result["cwd"] == "."
    # A non-zero exit code is a failed result (as UFO's shell tool: success = returncode == 0),
    # and its exit code and output are still there as data.
    assert failing.status == ResultStatus.FAILURE and failing.namespace == "shell"
    assert failing.result["exit_code"] == 3
    assert failing.result["stdout"] == "partial\n" and failing.result["stderr"] == "oops\n"
    assert "command exited with code 3 (expected 0)" in failing.error and "oops" in failing.error
    assert after.status == ResultStatus.SKIPPED  # the batch stops at the failure


async def test_expect_exit_declares_the_exit_codes_that_succeed(tmp_path: Path) -> None:
    [grep_miss, listed, unexpected, signalled] = await _run(
        ShellOptions.create(tmp_path),
        _shell("grep -q nothing /dev/null", expect_exit=[0, 1]),
        _shell("exit 2", expect_exit=[2]),
        _shell("exit 0", expect_exit=[1]),
        _shell("kill -9 $$", expect_exit=[0]),
    )
    assert grep_miss.status == ResultStatus.SUCCESS and grep_miss.result["exit_code"] == 1
    assert listed.status == ResultStatus.SUCCESS and listed.result["exit_code"] == 2
    assert unexpected.status == ResultStatus.FAILURE and "exited with code 0 (expected 1)" in unexpected.error
    assert signalled.status == ResultStatus.SKIPPED  # the batch stopped at the previous failure
    [killed] = await _run(ShellOptions.create(tmp_path), _shell("kill -9 $$"))
    assert killed.status == ResultStatus.FAILURE and killed.result["exit_code"] == -9
    [bad] = await _run(ShellOptions.create(tmp_path), _shell("true", expect_exit="0"))
    assert bad.status == ResultStatus.FAILURE and "expect_exit" in bad.error


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    [result] = await _run(
        ShellOptions.create(tmp_path),
        _shell("echo started; sleep 30 & echo $! > child.pid; wait", timeout=0.5),
    )
    assert time.monotonic() - started < 5
    assert result.status == ResultStatus.FAILURE
    assert "timed out after 0.5 s" in result.error and "process group was killed" in result.error
    assert "started" in result.error  # partial output is kept
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):
        if _dead(child):
            break
        await asyncio.sleep(0.05)
    assert _dead(child), "the background child survived the timeout"


async def test_a_call_cancelled_at_any_point_leaves_no_descriptor_and_no_command(tmp_path: Path) -> None:
    from saucer.tools.shell import run_command

    options = ShellOptions.create(tmp_path)
    await run_command("true", options)  # the process's watchdog pipe, opened once and kept
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(40):  # cancelled before, during and after the start of the command
        call = asyncio.ensure_future(run_command(f"touch ran{i}; sleep 30", options))
        for _ in range(i % 8):
            await asyncio.sleep(0)
        if i % 8 == 7:
            await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert len(os.listdir("/proc/self/fd")) == fds
    # Whatever started was stopped with its group: nothing is left sleeping in the root.
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cwd_is(pid, tmp_path) and not _dead(int(pid))]
    assert left == []


def _cwd_is(pid: str, path: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(path.resolve())
    except OSError:
        return False


async def test_a_caller_cancelling_during_the_clean_up_still_gets_the_group_killed(tmp_path: Path) -> None:
    # A command's own timeout starts the clean-up (SIGTERM ignored, so a grace period and SIGKILL);
    # the caller's deadline (a batch's) cancels in the middle of it: the group is killed all the same.
    from saucer.tools.shell import run_command

    options = ShellOptions.create(tmp_path)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1.0):
            await run_command("trap '' TERM; sleep 30 & echo $! > child.pid; wait", options, timeout=0.5)
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):  # SIGKILL was sent; its arrival is the kernel's
        if _dead(child):
            break
        await asyncio.sleep(0.02)
    assert _dead(child), "the command's group outlived a cancelled clean-up"


async def test_background_jobs_holding_the_output_are_stopped_not_waited_for(tmp_path: Path) -> None:
    started = time.monotonic()
    [held, detached] = await _run(
        ShellOptions.create(tmp_path),
        _shell("sleep 30 & echo $! > held.pid; echo done"),
        _shell("sleep 30 > /dev/null 2>&1 & echo $! > detached.pid"),
    )
    assert time.monotonic() - started < 5
    assert held.status == ResultStatus.SUCCESS and held.result["stdout"] == "done\n"
    assert "background processes" in held.result["note"] and detached.result["note"] is None
    detached_pid = int((tmp_path / "detached.pid").read_text())
    assert not _dead(detached_pid)  # a job that redirected its output keeps running
    os.kill(detached_pid, 9)
    held_pid = int((tmp_path / "held.pid").read_text())
    for _ in range(50):
        if _dead(held_pid):
            break
        await asyncio.sleep(0.05)
    assert _dead(held_pid)


async def test_output_is_capped_and_reported_as_truncated(tmp_path: Path) -> None:
    [result] = await _run(
        ShellOptions.create(tmp_path, max_output=1000),
        _shell("head -c 200000 /dev/zero | tr '\\0' a; echo small >&2"),
    )
    assert result.status == ResultStatus.SUCCESS
    out = result.result
    assert len(out["stdout"]) == 1000 and set(out["stdout"]) == {"a"}
    assert out["stdout_truncated"] is True and out["stdout_bytes"] == 200000
    assert out["stderr"] == "small\n" and out["stderr_truncated"] is False


async def test_deny_and_allow_rules(tmp_path: Path) -> None:
    options = ShellOptions.create(tmp_path, deny=["curl *", "re:\\bnc\\b"], allow=["echo *", "ls*", "curl *"])
    (denied,) = await _run(options, _shell("echo hi && curl http://example.invalid"))
    assert denied.status == ResultStatus.FAILURE and "deny rule 'curl *'" in denied.error
    (not_allowed,) = await _run(options, _shell("echo hi; python3 -c 'print(1)'"))
    assert not_allowed.status == ResultStatus.FAILURE and "matches no allow rule" in not_allowed.error
    (allowed,) = await _run(options, _shell("echo hi; ls"))
    assert allowed.status == ResultStatus.SUCCESS and allowed.result["stdout"].startswith("hi\n")
    (tmp_path / "keep").write_text("x")
    for hidden in ("if true; then curl x; fi", "{ curl x; }", "sh -c 'curl x'", "echo $(curl x)", "eval 'curl x'"):
        (refused,) = await _run(options, _shell(hidden))
        assert refused.status == ResultStatus.FAILURE and "deny rule 'curl *'" in refused.error, hidden
    (unknown,) = await _run(options, _shell("echo rm keep | sh"))
    assert unknown.status == ResultStatus.FAILURE and "cannot be checked" in unknown.error
    assert (tmp_path / "keep").exists()


async def test_cwd_stays_in_the_root_and_env_is_passed(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    options = ShellOptions.create(tmp_path)
    (inside,) = await _run(options, _shell("pwd; echo $GREETING", cwd="sub", env={"GREETING": "hello"}))
    assert inside.result["stdout"] == f"{(tmp_path / 'sub').resolve()}\nhello\n" and inside.result["cwd"] == "sub"
    (escape,) = await _run(options, _shell("pwd", cwd=".."))
    assert escape.status == ResultStatus.FAILURE and "escapes the sandbox root" in escape.error


async def test_the_command_runs_as_shell_c_with_no_input_and_a_missing_shell_is_an_error(tmp_path: Path) -> None:
    options = ShellOptions.create(tmp_path, shell="sh")  # found on PATH, as the system would find it
    (seen,) = await _run(options, _shell('echo "$0"; cat; echo "[$1]"'))
    assert seen.status == ResultStatus.SUCCESS
    assert seen.result["stdout"].splitlines() == [shutil.which("sh"), "[]"]
    (missing,) = await _run(ShellOptions.create(tmp_path, shell="/no/such/shell"), _shell("echo hi"))
    assert missing.status == ResultStatus.FAILURE
    assert "could not start /no/such/shell: not found or not executable" in missing.error


async def test_commands_run_without_blocking_the_server(tmp_path: Path) -> None:
    reads = [
        Command(tool_name="shell.run", tool_type="data_collection", parameters={"command": "sleep 0.6"})
        for _ in range(3)
    ]
    started = time.monotonic()
    results = await _run(ShellOptions.create(tmp_path), *reads, parallel=True)
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == [ResultStatus.SUCCESS] * 3
    assert elapsed < 1.5, f"three 0.6 s commands took {elapsed:.2f} s: the server ran them one at a time"


async def test_builtin_servers_over_stdio_with_sensitive_commands(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("precious\n")
    async with LocalCommandDispatcher.from_config(default_servers(tmp_path)) as dispatcher:
        tools = await dispatcher.list_tools()
        assert {"shell.run", "files.read", "files.write", "files.search"} <= set(tools)
        assert "rm *" in tools["shell.run"]["sensitive_commands"]
        write, cat = await dispatcher.execute_commands(
            [
                Command(tool_name="files.write", parameters={"path": "notes/a.txt", "content": "from files\n"}),
                Command(tool_name="run", parameters={"command": "cat notes/a.txt keep.txt"}),
            ]
        )
        assert write.status == ResultStatus.SUCCESS and write.result["bytes_written"] == 11
        assert cat.result["stdout"] == "from files\nprecious\n"
        refused, skipped = await dispatcher.execute_commands(
            [Command(tool_name="shell.run", parameters={"command": "rm keep.txt"}), Command(tool_name="files.list")]
        )
        assert refused.status == ResultStatus.FAILURE and "needs approval" in refused.error
        assert skipped.status == ResultStatus.SKIPPED
        assert (tmp_path / "keep.txt").exists()
        [escape] = await dispatcher.execute_commands([Command(tool_name="files.read", parameters={"path": "../x"})])
        assert escape.status == ResultStatus.FAILURE and "escapes the sandbox root" in escape.error


def test_options_from_argv_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAUCER_SHELL_DENY", "curl *\nwget *")
    monkeypatch.setenv("SAUCER_SHELL_TIMEOUT", "7")
    options = parse_options(["--root", str(tmp_path), "--max-output", "123"])
    assert options.root == tmp_path.resolve() and options.max_output == 123 and options.timeout == 7
    assert [r.pattern for r in options.deny] == ["curl *", "wget *"]
    assert [r.pattern for r in parse_options(["--deny", "rm *"]).deny] == ["rm *"]  # argv beats the environment


@pytest.mark.parametrize(
    "module, options",
    [
        ("saucer.tools.shell", ["--root", "--allow", "--deny", "--max-output", "--timeout"]),
        ("saucer.tools.files", ["--root", "--max-read", "--max-write", "--read-only"]),
    ],
)
def test_help_and_bad_options(module: str, options: list[str]) -> None:
    shown = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    for option in options:
        assert option in shown.stdout
    bad = subprocess.run(
        [sys.executable, "-m", module, "--root", "/no/such/dir"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert bad.returncode == 2 and "/no/such/dir" in bad.stderr
