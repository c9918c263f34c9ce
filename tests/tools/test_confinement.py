"""Confinement of commands and launched programs (saucer.tools.landlock, confine, _mounts; issue 27).

The wide test of hostile commands is tests/tools/test_confinement_kernel.py; these check each
piece: the Landlock binding on its own, the choice of confinement (and the refusal when there is
none), the private TMPDIR, the network rules, the desktop launcher, the isolated shell, and what
``saucer doctor`` and ``saucer run`` say.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import threading
import typing
from pathlib import Path

import pytest

from saucer.config import ShellSettings
from saucer.tools import confine, landlock
from saucer.tools.confine import Confiner, Policy, resolve
from saucer.tools.native import ToolError
from saucer.tools.shell import ShellOptions, run_command

pytestmark = pytest.mark.anyio

ABI = landlock.abi_version()
needs_landlock = pytest.mark.skipif(ABI < 1, reason="this kernel offers no Landlock")
needs_bwrap = pytest.mark.skipif(
    resolve("bubblewrap").error is not None and os.environ.get("CI") != "true",
    reason="bubblewrap is missing or unusable (apt-get install -y bubblewrap)",
)


def _in_thread(fn: typing.Callable[[], object]) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


@needs_landlock
def test_landlock_confines_the_thread_and_its_children_only(tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()

    def confined() -> list[int]:
        with landlock.Ruleset(ABI) as rules:
            rules.allow_path("/", landlock.FS_READ)
            rules.allow_path(inside, landlock.FS_WRITE)
            rules.restrict_self()
        codes = []
        for target in (inside / "a", outside / "b"):
            codes.append(subprocess.run(["/bin/sh", "-c", f"echo x > {target}"], capture_output=True).returncode)
        return codes

    assert _in_thread(confined) == [0, 2]
    assert (inside / "a").exists() and not (outside / "b").exists()
    (outside / "c").write_text("the host's other threads are free")  # this thread was never restricted


@needs_landlock
def test_a_missing_path_is_skipped_and_rights_are_cut_to_the_abi(tmp_path: Path) -> None:
    with landlock.Ruleset(ABI) as rules:
        rules.allow_path(tmp_path / "missing", landlock.FS_WRITE)  # no error
        rules.allow_path("/dev/null", landlock.FS_WRITE)  # a file: directory rights are dropped, not an error
    assert landlock.fs_rights(1) == (1 << 13) - 1 and landlock.fs_rights(3) & landlock.TRUNCATE
    assert not landlock.fs_rights(2) & landlock.TRUNCATE
    with pytest.raises(landlock.LandlockError, match="not available"):
        landlock.Ruleset(0)


@needs_landlock
@pytest.mark.skipif(ABI < 4, reason="TCP rules need Landlock ABI 4")
async def test_network_off_and_ports(tmp_path: Path) -> None:
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        allowed, other = (s.getsockname()[1] for s in servers)
        connect = "python3 -c 'import socket,sys; socket.create_connection((\"127.0.0.1\", int(sys.argv[1])), 2)' "
        on = ShellOptions.create(tmp_path, sandbox="landlock")
        off = ShellOptions.create(tmp_path, sandbox="landlock", network=False)
        ports = ShellOptions.create(tmp_path, sandbox="landlock", network=[allowed])
        assert (await run_command(connect + str(allowed), on)).exit_code == 0
        assert (await run_command(connect + str(allowed), off)).exit_code != 0
        assert (await run_command(connect + str(allowed), ports)).exit_code == 0
        refused = await run_command(connect + str(other), ports)
        assert refused.exit_code != 0 and "Permission denied" in refused.stderr
    finally:
        for server in servers:
            server.close()


@needs_bwrap
async def test_bubblewrap_network_off_and_writes(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    server = socket.create_server(("127.0.0.1", 0))
    try:
        port = server.getsockname()[1]
        options = ShellOptions.create(tmp_path / "ws", sandbox="bubblewrap", network=False)
        result = await run_command(
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'; "
            "echo in > inside; echo out > ../outside; touch $TMPDIR/t && echo tmp",
            options,
        )
    finally:
        server.close()
    assert "Network is unreachable" in result.stderr or "refused" in result.stderr
    assert (tmp_path / "ws" / "inside").read_text() == "in\n" and not (tmp_path / "outside").exists()
    assert "Read-only file system" in result.stderr and result.stdout == "tmp\n"


@needs_landlock
async def test_signals_stay_inside_the_domain(tmp_path: Path) -> None:
    if ABI < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        result = await run_command(f"kill -TERM {sleeper.pid}", ShellOptions.create(tmp_path, sandbox="landlock"))
        assert result.exit_code != 0 and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="the read-only mount namespace is root's")
@needs_landlock
async def test_root_cannot_change_modes_owners_or_times_outside(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    decoy = tmp_path / "decoy"
    decoy.write_text("x")
    before = os.stat(decoy)
    result = await run_command(
        f"chmod 000 {decoy}; chown nobody {decoy}; touch {decoy}; chmod 700 . && echo ws-ok",
        ShellOptions.create(tmp_path / "ws", sandbox="landlock"),
    )
    after = os.stat(decoy)
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (before.st_mode, before.st_uid, before.st_mtime_ns)
    assert result.stderr.count("Read-only file system") == 3 and result.stdout == "ws-ok\n"


def test_the_choice_of_confinement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "_landlock_abi", lambda: 0)
    monkeypatch.setattr(confine, "_bwrap_usable", lambda path: None)
    monkeypatch.setattr(confine, "bubblewrap_path", lambda: "/usr/bin/bwrap")
    assert resolve("auto").kind == "bubblewrap"  # no Landlock: the fallback
    assert "offers no Landlock" in (resolve("landlock").error or "")
    monkeypatch.setattr(confine, "bubblewrap_path", lambda: None)
    none = resolve("auto")
    assert (
        none.kind == "none"
        and 'sandbox = "off"' in (none.error or "")
        and "apt-get install -y bubblewrap" in none.error
    )
    assert resolve("off").kind == "off" and resolve("off").error is None
    monkeypatch.setattr(confine, "_landlock_abi", lambda: 7)
    assert resolve("auto").kind == "landlock" and "bwrap" in (resolve("bubblewrap").error or "")


async def test_without_confinement_commands_are_refused_and_it_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(confine, "_landlock_abi", lambda: 0)
    monkeypatch.setattr(confine, "bubblewrap_path", lambda: None)
    monkeypatch.setattr(confine, "_notices", set())
    options = ShellOptions.create(tmp_path, sandbox="auto")
    for _ in range(3):
        with pytest.raises(ToolError, match='commands are refused.*sandbox = "off"'):
            await run_command("touch ran", options)
    assert not (tmp_path / "ran").exists()
    assert capfd.readouterr().err.count("commands are refused") == 1
    unconfined = ShellOptions.create(tmp_path, sandbox="off")
    for _ in range(2):
        assert (await run_command("touch ran", unconfined)).exit_code == 0
    assert capfd.readouterr().err.count('sandbox = "off"') == 1


def test_policy_values_are_checked() -> None:
    with pytest.raises(ValueError, match="sandbox must be one of"):
        Policy.create("chroot")
    with pytest.raises(ValueError, match="between 1 and 65535"):
        Policy.create(network=[0])
    assert Policy.create(write=["/tmp/../tmp"]).write == (os.path.realpath("/tmp"),)
    assert tuple(ShellSettings.model_fields["sandbox"].annotation.__args__) == confine.SANDBOX_MODES  # type: ignore[union-attr]


async def test_the_private_tmpdir_is_the_commands_and_goes_away(tmp_path: Path) -> None:
    confiner = Confiner(Policy.create("off", (tmp_path,)))
    folder = confiner.tmpdir
    assert confiner.environment({"A": "1"}) == {"A": "1", "TMPDIR": folder, "TMP": folder, "TEMP": folder}
    assert os.stat(folder).st_mode & 0o777 == 0o700
    del confiner
    gc.collect()
    assert not os.path.exists(folder)
    result = await run_command('echo "$TMPDIR"; mktemp', ShellOptions.create(tmp_path, sandbox="auto"))
    tmpdir, made = result.stdout.split()
    assert Path(made).parent == Path(tmpdir) and Path(tmpdir).name.startswith("saucer-tmp-")


@needs_landlock
def test_the_desktop_launcher_starts_programs_confined(tmp_path: Path) -> None:
    from saucer.tools.desktop.apps import Launcher

    ws, art = tmp_path / "ws", tmp_path / "art"
    ws.mkdir()
    art.mkdir()
    launcher = Launcher(Policy.create("landlock", (ws, art), scoped=False))
    proc = launcher.start(
        ["/bin/sh", "-c", f"echo x > {tmp_path}/outside; echo y > {ws}/inside; echo $TMPDIR"],
        cwd=ws,
        env={"PATH": "/usr/bin:/bin"},
        log=lambda: open(art / "launch.log", "ab"),  # noqa: SIM115 - a factory: Launcher.start closes what it opens
    )
    proc.wait(timeout=30)
    assert not (tmp_path / "outside").exists() and (ws / "inside").exists()
    assert "saucer-tmp-" in (art / "launch.log").read_text()


@needs_landlock
async def test_the_isolated_shell_is_confined_too(tmp_path: Path) -> None:
    from saucer.dispatch import Command, LocalCommandDispatcher, default_servers

    (tmp_path / "ws").mkdir()
    servers = default_servers(tmp_path / "ws", isolate=["shell"], shell=ShellSettings(sandbox="landlock"))
    assert "--sandbox" in servers["shell"].args
    async with LocalCommandDispatcher.from_config(servers, assume_yes=True) as dispatcher:
        [result] = await dispatcher.execute_commands(
            [
                Command(
                    tool_name="shell.run",
                    parameters={"command": "echo x > ../outside; echo y > inside"},
                )
            ]
        )
    assert "Permission denied" in str(result.result) + str(result.error) or "Read-only" in str(result.result)
    assert not (tmp_path / "outside").exists() and (tmp_path / "ws" / "inside").exists()


def _saucer(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        cwd=cwd,
        env={**base, "COLUMNS": "300", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_doctor_and_run_say_which_confinement_is_in_force(tmp_path: Path) -> None:
    doctor = _saucer("doctor", cwd=tmp_path)
    first = doctor.stdout.splitlines()[0]
    assert doctor.returncode == 0 and first.startswith("confinement: ") and str(tmp_path) in first
    if ABI:
        assert first.startswith(f"confinement: Landlock ABI {ABI}") and f"landlock: ABI {ABI}" in doctor.stdout
    (tmp_path / "plan.json").write_text(
        '{"task": "t", "steps": [{"subtask": "s", "commands": [{"tool_name": "shell.run", "parameters": {"command": "true"}}]}]}'
    )
    ran = _saucer("run", "--plan", "plan.json", cwd=tmp_path)
    assert ran.returncode == 0 and first in ran.stderr.splitlines(), ran.stderr
    # Nothing available as asked: doctor exits 1 and says why; a run refuses its commands, saying so once.
    missing = {"SAUCER_SHELL__SANDBOX": "bubblewrap", "PATH": str(tmp_path / "nowhere")}
    doctor = _saucer("doctor", cwd=tmp_path, env=missing)
    assert (
        doctor.returncode == 1 and "confinement: none: " in doctor.stdout and "bwrap is not installed" in doctor.stdout
    )
    (tmp_path / "plan2.json").write_text(
        '{"task": "u", "steps": [{"subtask": "a", "commands": [{"tool_name": "shell.run", "parameters": {"command": "touch a"}}]},'
        ' {"subtask": "b", "commands": [{"tool_name": "shell.run", "parameters": {"command": "touch b"}}]}]}'
    )
    refused = _saucer("run", "--plan", "plan2.json", "--yes", cwd=tmp_path, env=missing)
    assert refused.returncode != 0 and not (tmp_path / "a").exists()
    assert refused.stderr.count('saucer: [shell] sandbox = "bubblewrap" but bwrap is not installed') == 1, (
        refused.stderr
    )


def test_confinement_line_names_the_network_and_folders() -> None:
    line = confine.confinement_line(Policy.create("off"))
    assert line == 'confinement: off ([shell] sandbox = "off"): commands run unconfined'
    if ABI >= 1:
        policy = Policy.create("landlock", ("/srv/ws",), network=[443])
        line = confine.confinement_line(policy, also=("the artifacts",))
        assert "writes: /srv/ws, the artifacts, a private temporary folder (TMPDIR)" in line
        assert line.endswith("network: TCP connect to ports 443")


def test_asyncio_loop_is_never_handed_a_cancelled_start(tmp_path: Path) -> None:
    # Many starts cancelled while the confining thread runs: every descriptor comes back (no leak).
    async def main() -> None:
        options = ShellOptions.create(tmp_path, sandbox="auto")
        await run_command("true", options)
        fds = len(os.listdir("/proc/self/fd"))
        for i in range(30):
            task = asyncio.ensure_future(run_command("sleep 5", options))
            await asyncio.sleep(0.001 * (i % 5))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.sleep(0.2)
        assert len(os.listdir("/proc/self/fd")) == fds

    asyncio.run(main())


@pytest.mark.parametrize("sandbox", ["landlock", "bubblewrap"])
async def test_reads_can_be_narrowed(tmp_path: Path, sandbox: str) -> None:
    if resolve(sandbox).error is not None:
        pytest.skip(resolve(sandbox).error or "")
    (tmp_path / "ws").mkdir()
    (tmp_path / "secret").write_text("not for commands\n")
    system = [p for p in ("/usr", "/bin", "/lib", "/lib64", "/etc") if os.path.exists(p)]
    narrow = ShellOptions.create(tmp_path / "ws", sandbox=sandbox, read=system)
    result = await run_command("echo mine > m && cat m; cat ../secret", narrow)
    assert result.stdout == "mine\n" and result.exit_code != 0 and "not for commands" not in result.stdout
    wide = await run_command("cat ../secret", ShellOptions.create(tmp_path / "ws", sandbox=sandbox))
    assert wide.stdout == "not for commands\n"


@needs_landlock
def test_a_folder_that_appears_later_becomes_writable_and_threads_end_with_their_confiner(tmp_path: Path) -> None:
    ws, art = tmp_path / "ws", tmp_path / "art"
    ws.mkdir()
    confined = lambda: sum(t.name.startswith("saucer-confined") for t in threading.enumerate())  # noqa: E731
    before = confined()
    confiner = Confiner(Policy.create("landlock", (ws, art)))
    write = ["/bin/sh", "-c", f"echo x > {art}/made"]
    assert confiner.popen(write, cwd=ws, stderr=subprocess.DEVNULL).wait(timeout=30) != 0  # no such folder yet
    art.mkdir()  # the desktop server makes the artifacts folder when it first saves something
    assert confiner.popen(write, cwd=ws).wait(timeout=30) == 0 and (art / "made").exists()
    assert (
        confiner.popen(["/bin/sh", "-c", f"echo x > {tmp_path}/out"], cwd=ws, stderr=subprocess.DEVNULL).wait(30) != 0
    )
    assert confined() > before
    folder = confiner.tmpdir
    del confiner
    gc.collect()
    assert not os.path.exists(folder)
    for _ in range(100):  # its threads were told to end
        if confined() == before:
            break
        threading.Event().wait(0.05)
    assert confined() == before


def test_the_shell_settings_reach_every_built_in_server(tmp_path: Path) -> None:
    from saucer.dispatch.servers import DesktopServer, default_servers

    shell = ShellSettings(sandbox="bubblewrap", network=[80, 443], read=[Path("/usr")], write=[Path("/srv/cache")])
    servers = default_servers(
        tmp_path,
        shell=shell,
        artifacts=tmp_path / "art",
        desktop=DesktopServer(artifacts=tmp_path / "art", sandbox=shell),
    )
    options = servers["shell"].options
    assert (options["sandbox"], options["network"], options["read"]) == ("bubblewrap", [80, 443], ["/usr"])
    assert options["write"] == [str((tmp_path / "art").resolve()), "/srv/cache"]
    flags = ["--sandbox", "bubblewrap", "--network", "80,443", "--read", "/usr", "--write", "/srv/cache"]
    assert servers["desktop"].args[3 : 3 + len(flags)] == flags
    isolated = default_servers(tmp_path, isolate=True, shell=ShellSettings(network=False), artifacts=tmp_path / "art")
    args = isolated["shell"].args
    assert args[args.index("--network") + 1] == "off" and args[-2:] == ["--write", str((tmp_path / "art").resolve())]
