"""The kernel is the wall (issue 27): 500 hostile commands change nothing outside the allowed folders.

The commands are generated from every wrapper the prompt knows, interpreters (Python, Perl, awk),
``trap``, ``eval``, base64-decoded scripts, ``find -delete``, symbolic and hard links, ``..``,
``/proc/self/root``, ``/proc/self/cwd``, writes through ``/proc/self/fd`` and ``/dev/fd``, bind
mounts and remounts, device nodes... Each targets a decoy tree beside the workspace, by one of a
dozen spellings of its path. They run through the real shell tool (the in-process dispatcher with
the default servers, confirmation forced to *yes*), concurrently, under Landlock and under the
bubblewrap fallback. Afterwards the decoy tree and the folder around the workspace hash the same
(names, types, contents, link targets, modes, owners, link counts, modification times), and the
workspace still works. A control runs a sample of the same commands unconfined against its own
decoy and shows that they do destroy it, so the test can fail.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import platform
import random
import shlex
import shutil
import stat
from pathlib import Path

import pytest

from saucer.config import ShellSettings
from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus, default_servers
from saucer.tools.confine import resolve

pytestmark = pytest.mark.anyio

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
ROOT = os.geteuid() == 0
COUNT = 500
CONCURRENCY = 12

# Prefixes that run ``sh -c CODE`` through a wrapper (argument-vector wrappers).
ARGV_WRAPPERS = [
    "",
    "env",
    "env -i PATH=/usr/bin:/bin",
    "nice -n 5",
    "nohup",
    "timeout 20",
    "stdbuf -oL",
    "setsid",
    "ionice -c 3",
    "chrt -o 0",
    "setpriv --nnp",
    "prlimit --nofile=256",
    "command",
    "exec",
    "time",
    *(["runuser -u root --", "unshare -m", "unshare -m --propagation private"] if ROOT else []),
    *(["setarch linux64", "linux64"] if platform.machine() == "x86_64" else []),
    *(["busybox"] if shutil.which("busybox") else []),
]


def _code_wrappers(code: str) -> list[str]:
    """Ways to run the shell code ``code`` as a string (nothing of it is visible as words)."""
    q = shlex.quote(code)
    encoded = base64.b64encode(code.encode()).decode()
    forms = [
        f"sh -c {q}",
        f"bash -c {q}",
        f"eval {q}",
        f"trap {q} EXIT; true",
        f"echo {encoded} | base64 -d | sh",
        f"printf '%s' {q} | bash",
        f"find . -maxdepth 0 -exec sh -c {q} \\;",
        f"echo {q} | xargs -0 sh -c",
        f"script -qc {q} /dev/null",
        f"{PY} -c 'import os,sys; os.system(sys.argv[1])' {q}",
        f"perl -e 'system($ARGV[0])' {q}",
        f'x=$(echo {encoded} | base64 -d); eval "$x"',
        f"f() {{ {code}\n}}; f",
        f'bash -c "$(echo {encoded} | base64 -d)"',
    ]
    if ROOT:
        forms += [f"su -c {q} root", f"sg root -c {q}", f"runuser root -c {q}"]
    return forms + [f"{w} sh -c {q}".strip() for w in ARGV_WRAPPERS]


def _spellings(decoy: str, name: str) -> list[tuple[str, str]]:
    """(setup, path) pairs that reach ``decoy/name`` from the workspace."""
    return [
        ("", f"{decoy}/{name}"),
        ("", f"../decoy/{name}"),
        ("", f"/proc/self/root{decoy}/{name}"),
        ("", f"/proc/self/cwd/../decoy/{name}"),
        ("", f"{decoy}/./sub/../{name}"),
        ("", f"/{decoy}//{name}"),
        (f"ln -sfn {decoy} l; ", f"l/{name}"),
        ("", f"/proc/$$/root{decoy}/{name}"),
        ("", f"$(cd ..; pwd)/decoy/{name}"),
        ("", f"{decoy}/dirlink/../{name}"),
        ("cd .. && ", f"decoy/{name}"),
        (f"ln -sfn ../decoy/{name} t; ", "t"),
    ]


def _actions(p: str, decoy: str) -> list[str]:
    """Shell code that changes the file at path ``p`` one way or another."""
    return [
        f"rm -rf {p}",
        f"rm -f {p}",
        f"echo pwned > {p}",
        f"echo pwned >> {p}",
        f"truncate -s 0 {p}",
        f"dd if=/dev/zero of={p} bs=1 count=4 conv=notrunc",
        f"cp /etc/hostname {p}",
        f"mv {p} stolen",
        f"chmod 000 {p}",
        f"chown nobody {p}",
        f"touch {p}",
        f"ln -sf /etc/passwd {p}",
        f"shred -u {p}",
        f"unlink {p}",
        f"sed -i s/./X/ {p}",
        f"echo pwned | tee {p}",
        f"printf x 1<> {p}",
        f"mkdir {p}.d",
        f"mkfifo {p}.fifo",
        f"ln {p} hard && echo pwned >> hard",
        f"exec 3<>{p}; echo pwned >&3",
        f"exec 3<{p}; echo pwned > /proc/self/fd/3",
        f"exec 3<{p}; echo pwned > /dev/fd/3",
        f"{PY} -c \"import shutil; shutil.rmtree('{decoy}')\"",
        f"{PY} -c \"open('{p}', 'w').write('x')\"",
        f"{PY} -c \"import os; os.unlink('{p}')\"",
        f"{PY} -c \"import os; os.chmod('{p}', 0)\"",
        f"{PY} -c \"import os; os.rename('{p}', 'stolen')\"",
        f"{PY} -c \"import os; os.utime('{p}', (0, 0))\"",
        f"perl -e 'unlink \"{p}\"'",
        f'perl -e \'open(F, ">", "{p}"); print F "x"\'',
        f"perl -e 'chmod 0, \"{p}\"'",
        f'awk \'BEGIN {{ print "x" > "{p}" }}\'',
        f"find {decoy} -delete",
        f"find {decoy} -type f -exec rm -f {{}} +",
        f"find {decoy} -type f -exec sh -c 'echo x > \"$1\"' _ {{}} \\;",
        f"chattr +i {p}",
        f"cp -r {decoy} mine && rm -rf {decoy}",
        f"mv {decoy} gone",
        f"touch -d 2000-01-01 {p}",
        f"chmod -R 777 {decoy}",
        f"chown -R nobody {decoy}",
    ]


SPECIALS = [
    "mount --bind . {decoy}",
    "mount -o remount,rw /",
    "mount -t tmpfs none {decoy}",
    "umount -l /",
    "mknod disk b 8 0 && echo x > disk",
    "mknod null2 c 1 3 && ls -l null2",
    "rm -rf /proc/self/root{decoy}",
    "cd / && rm -rf {decoy}",
    "cd {decoy} && rm -rf ./* .[!.]*",
    "echo x > ../new-file-beside-workspace",
    "mkdir ../new-dir-beside-workspace",
    "ln -s /etc ../new-link-beside-workspace",
    'rm -rf "$PWD"',
    'mv "$PWD" ../moved-workspace',
    "unshare -m sh -c 'mount --bind . {decoy}; echo x > {decoy}/a.txt'",
    "nsenter -t 1 -m -- sh -c 'echo x > {decoy}/a.txt'",
    "insmod /nonexistent.ko",
    "echo x | tee -a {decoy}/sub/deep/d.txt",
    "sed -i 1d {decoy}/sub/c.txt",
    "rm -rf {decoy}/sub/deep",
]


def generate(decoy: str, count: int = COUNT) -> list[str]:
    """``count`` hostile command lines (the same for a given seed), every wrapper, spelling and action used."""
    rng = random.Random(27)
    names = ["a.txt", "b.bin", "sub/c.txt", "ro.txt", "link", "sub"]
    lines = [special.format(decoy=decoy) for special in SPECIALS]
    seen = set(lines)
    index = 0
    while len(lines) < count:  # every action and wrapper in turn; the path spelling and the target at random
        name = rng.choice(names)
        setup, path = rng.choice(_spellings(decoy, name))
        actions = _actions(path, decoy)
        code = setup + actions[index % len(actions)]
        wrappers = _code_wrappers(code)
        line = wrappers[(index // 2) % len(wrappers)] if index % 4 else code
        index += 1
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines[:count]


def make_layout(base: Path) -> tuple[Path, Path, Path]:
    """The workspace, the artifacts folder and the decoy tree (files, a read-only file, links, depth)."""
    ws, art, decoy = base / "ws", base / "art", base / "decoy"
    for folder in (ws / "src", art, decoy / "sub" / "deep"):
        folder.mkdir(parents=True)
    (ws / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    (decoy / "a.txt").write_text("the decoy's first file\n")
    (decoy / "b.bin").write_bytes(bytes(range(256)) * 4)
    (decoy / "sub" / "c.txt").write_text("third\n")
    (decoy / "sub" / "deep" / "d.txt").write_text("deep\n")
    (decoy / "ro.txt").write_text("read only\n")
    (decoy / "ro.txt").chmod(0o444)
    (decoy / "link").symlink_to("a.txt")
    (decoy / "dirlink").symlink_to("sub")
    return ws, art, decoy


def fingerprint(base: Path, skip: tuple[Path, ...]) -> dict[str, tuple[object, ...]]:
    """Every entry under ``base`` but ``skip``: type, mode, owner, links, size, mtime, content or link target."""
    found: dict[str, tuple[object, ...]] = {}
    for top, dirs, files in os.walk(base, followlinks=False):
        dirs[:] = [d for d in dirs if Path(top, d) not in skip]
        for name in [*dirs, *files, "."]:
            path = Path(top, name)
            if path in skip:
                continue
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                content: object = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            else:
                content = None
            found[str(path.relative_to(base))] = (
                stat.S_IFMT(info.st_mode),
                stat.S_IMODE(info.st_mode),
                info.st_uid,
                info.st_gid,
                info.st_nlink,
                info.st_size if not stat.S_ISDIR(info.st_mode) else None,
                info.st_mtime_ns,
                content,
            )
    return found


async def run_all(ws: Path, art: Path, sandbox: str, lines: list[str], *, probe: bool = True) -> list[object]:
    """Every line through the dispatcher's shell tool, approved, ``CONCURRENCY`` at a time; then (``probe``)
    the workspace, the private TMPDIR and the artifacts folder must still work."""
    servers = default_servers(ws, shell=ShellSettings(sandbox=sandbox), artifacts=art)
    limit = asyncio.Semaphore(CONCURRENCY)
    async with LocalCommandDispatcher.from_config(servers, assume_yes=True) as dispatcher:

        async def one(line: str) -> object:
            async with limit:
                [result] = await dispatcher.execute_commands(
                    [Command(tool_name="shell.run", parameters={"command": line, "timeout": 30})]
                )
                return result

        results = await asyncio.gather(*(one(line) for line in lines))
        if not probe:
            return list(results)
        # The workspace still works (its contents are the commands' to delete): make, write, read, list.
        [after] = await dispatcher.execute_commands(
            [
                Command(
                    tool_name="shell.run",
                    parameters={"command": "mkdir -p check && echo ok > check/probe && cat check/probe && ls check"},
                )
            ]
        )
        assert after.status == ResultStatus.SUCCESS, after.error
        assert after.result["stdout"] == "ok\nprobe\n" and ws.is_dir()
        # The private TMPDIR and the artifacts folder are writable.
        [tmp] = await dispatcher.execute_commands(
            [
                Command(
                    tool_name="shell.run",
                    parameters={"command": f'echo t > "$TMPDIR/t" && echo a > {art}/a && cat "$TMPDIR/t"'},
                )
            ]
        )
        assert tmp.status == ResultStatus.SUCCESS and tmp.result["stdout"] == "t\n", tmp.error
    return list(results)


def _available(sandbox: str) -> None:
    found = resolve(sandbox)
    if found.error is None:
        return
    if sandbox == "bubblewrap" and os.environ.get("CI") == "true":
        pytest.fail(f"{found.error}; under CI=true the bubblewrap tests must run")
    pytest.skip(found.error)


def _bytes_only(found: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    """Names, types, sizes, contents and link targets: what Landlock alone keeps (not modes, owners, times)."""
    return {key: (entry[0], entry[5], entry[7]) for key, entry in found.items()}


@pytest.mark.parametrize("sandbox", ["landlock", "landlock-alone", "bubblewrap"])
async def test_500_hostile_commands_change_nothing_outside(
    tmp_path: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``landlock-alone``: without the read-only mount namespace root gets (as for any other user)."""
    alone = sandbox == "landlock-alone"
    if alone:
        from saucer.tools import _mounts

        monkeypatch.setattr(_mounts, "read_only_view", lambda writable: False)
        sandbox = "landlock"
    _available(sandbox)
    ws, art, decoy = make_layout(tmp_path)
    lines = generate(str(decoy))
    assert len(lines) == len(set(lines)) == COUNT
    before = fingerprint(tmp_path, skip=(ws, art))
    results = await run_all(ws, art, sandbox, lines)
    after = fingerprint(tmp_path, skip=(ws, art))
    if alone:  # Landlock cannot refuse chmod, chown or utime yet: the bytes are what it keeps
        before, after = _bytes_only(before), _bytes_only(after)
    changed = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
    assert changed == [], f"under {sandbox}, changed outside the allowed folders: {changed[:20]}"
    # Nothing was refused before running (confirmation is forced to yes): every line ran, and the
    # kernel said no (many exit non-zero with EACCES, EROFS, EPERM, EXDEV...).
    errors = [r.error or "" for r in results if r.status != ResultStatus.SUCCESS]  # type: ignore[attr-defined]
    assert not [e for e in errors if "needs approval" in e or "refused" in e.split(":")[0]], errors[:5]
    denied = sum(
        1
        for e in errors
        if any(
            word in e
            for word in (
                "Permission denied",
                "Read-only file system",
                "Operation not permitted",
                "cross-device",
                "Errno 1",
                "Errno 13",
                "Errno 30",
                "Errno 18",
                "not permitted",
                "read-only",
            )
        )
    )
    assert denied > COUNT // 3, f"only {denied} commands were denied by the kernel: {errors[:5]}"


async def test_the_control_unconfined_destroys_its_decoy(tmp_path: Path) -> None:
    """The same generator, unconfined, against a decoy of its own: the fingerprint changes (the test can fail)."""
    ws, art, decoy = make_layout(tmp_path)
    unsafe = ("mount", "nsenter", "insmod", "mknod", "chattr", "PWD")  # kept off this machine's real mounts
    lines = [line for line in generate(str(decoy), 150) if not any(word in line for word in unsafe)][:100]
    before = fingerprint(tmp_path, skip=(ws, art))
    await run_all(ws, art, "off", lines, probe=False)
    after = fingerprint(tmp_path, skip=(ws, art))
    changed = [key for key in before.keys() | after.keys() if before.get(key) != after.get(key)]
    assert len(changed) >= 5, f"the hostile commands changed only {changed} even unconfined: they test little"
