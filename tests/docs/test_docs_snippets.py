"""Every shell and Python block of README.md and docs/ runs as written, twice (snippets are idempotent; a block that needs the local model, once).

Each page runs in a working folder of its own, laid out like a clone (``.venv``, ``examples``, ``scripts``,
``Makefile``... linked from the repository), with a fresh store (no ``SAUCER_*`` variable comes in, so the
default ``sqlite:///.saucer/saucer.db`` is new) and ``.venv/bin`` on ``PATH``. The blocks of one page run in
order and share that folder and the variables their shell blocks export. Shell blocks run under
``bash -euo pipefail``, so an undefined variable fails; each block runs a second time right after the first
to show that re-running it works (a ``background`` block runs once and is stopped after the page's last block).
A port a page fixes (``saucer serve --port 8765``) is replaced in all its blocks by one free on this machine, so
a server someone already runs on the documented port cannot answer in the page's place.

A block marked ``{needs=...}`` (see ``docs_blocks.py``) runs only where that is available and is skipped
elsewhere with the command that enables it; under ``CI=true`` a missing need fails instead, so CI runs them.
A block marked ``{test=PATH}`` is run by that test. Once a block of a page is skipped, the page's later
blocks are too (they may depend on it). ``python tests/docs/docs_blocks.py`` prints the counts.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docs_blocks import NOT_IN_CI, PYTHON, ROOT, Block, pages, parse

BLOCKS = [block for page in pages() for block in parse(page) if block.runnable]
RUN = [block for block in BLOCKS if block.test is None]
LAST_OF_PAGE = {block.page: block.line for block in RUN}
#: What a page's working folder links from the repository, so that commands written for a clone work.
CLONE_LINKS = (".venv", "Makefile", "pyproject.toml", "uv.lock", "examples", "scripts", "src", "tests", "bench", "docs")
BLOCK_TIMEOUT = 600  # a local model's session on a loaded 2-core machine takes minutes
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
DESKTOP_PROGRAMS = ("Xvfb", "xvfb-run", "dbus-run-session", "gnome-calculator")

#: need -> (why it is skipped, with the one command that enables it)
ENABLE = {
    "postgres": f"needs PostgreSQL: export SAUCER_TEST_POSTGRES_URL={POSTGRES_DEFAULT}",
    "llm": "needs llama-server and its model: make llama-server",
    "desktop": "needs the desktop's Debian packages: apt-get install -y xvfb at-spi2-core dbus gnome-calculator",
    "chromium": "needs Debian's Chromium: apt-get install -y chromium",
    "root": "needs root (it installs Debian packages): run the tests as root",
    "openai": "needs an OpenAI-compatible vision model and its key: export OPENAI_API_KEY=...",
}


def _has(need: str) -> bool:
    if need == "postgres":
        return bool(os.environ.get("SAUCER_TEST_POSTGRES_URL"))
    if need == "llm":
        check = [sys.executable, str(ROOT / "scripts" / "llama_server.py"), "--check"]
        return subprocess.run(check, capture_output=True, timeout=60).returncode == 0
    if need == "desktop":
        return all(shutil.which(program) for program in DESKTOP_PROGRAMS)
    if need == "chromium":
        return bool(shutil.which("chromium"))
    if need == "root":
        return os.geteuid() == 0
    if need == "openai":
        return bool(os.environ.get("OPENAI_API_KEY"))
    raise AssertionError(f"unknown need {need!r}")


@dataclass
class PageRun:
    """One page's working folder, how far its blocks have run, and its background processes."""

    folder: Path
    done: set[int] = field(default_factory=set)
    failed: str | None = None
    skipped: str | None = None
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: the page's fixed ports (``--port 8765``) -> a port free on this machine, so that a server already
    #: listening there (a reader's own, another run's) cannot answer in the page's place
    ports: dict[str, str] = field(default_factory=dict)

    def code(self, block: Block) -> str:
        """The block's code with the page's fixed ports replaced by the ones this run uses."""
        if not self.ports:
            return block.code
        return re.sub(r"\b(" + "|".join(self.ports) + r")\b", lambda m: self.ports[m.group(1)], block.code)

    def stop_background(self) -> None:
        """SIGTERM to each background block's whole process group, SIGKILL to what is left after 15 s."""
        for proc in self.background:
            _stop_group(proc)
            proc.wait()
        self.background.clear()


RUNS: dict[str, PageRun] = {}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """Stop every process of ``proc``'s group (a server may outlive the shell that started it, shutting down
    slowly); ``proc`` itself is reaped, so that a zombie leader does not keep the group alive."""
    pgid = proc.pid
    proc.poll()
    if not _group_alive(pgid):
        return
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def _environment(folder: Path) -> dict[str, str]:
    # A reader's shell: none of saucer's settings, nor the variables of the make (`make test`) or pytest running us.
    inherited = (
        "SAUCER_",
        "VIRTUAL_ENV",
        "PYTEST_",
        "MAKEFLAGS",
        "MFLAGS",
        "MAKELEVEL",
        "MAKE_TERMOUT",
        "MAKE_TERMERR",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env["PATH"] = f"{folder / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["DOCS_ENV_FILE"] = str(folder / ".docs-env")
    env.setdefault("NO_COLOR", "1")
    return env


# Each block sources what the page's earlier blocks exported, and leaves what it exports for the next.
WRAPPER = """
if [ -f "$DOCS_ENV_FILE" ]; then source "$DOCS_ENV_FILE"; fi
trap 'export -p | grep -v " DOCS_" > "$DOCS_ENV_FILE"' EXIT
set -euo pipefail
"""


def _script(block: Block, code: str) -> list[str]:
    if block.language in PYTHON:
        return ["bash", "-c", WRAPPER + 'exec python -c "$DOCS_BLOCK_CODE"']
    return ["bash", "-c", WRAPPER + code]


def free_ports(page_blocks: list[Block]) -> dict[str, str]:
    """Each port a page's blocks fix with ``--port N`` -> a port that nothing on this machine listens on now."""
    ports = {}
    for port in sorted({p for b in page_blocks for p in re.findall(r"--port[ =](\d{4,5})\b", b.code)}):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            ports[port] = str(sock.getsockname()[1])
    return ports


def _run(block: Block, run: PageRun, attempt: str) -> None:
    code = run.code(block)
    env = _environment(run.folder) | {"DOCS_BLOCK_CODE": code}
    if block.background:
        log = open(run.folder / f".docs-background-{block.line}.log", "wb")  # noqa: SIM115 (the process keeps it)
        run.background.append(
            subprocess.Popen(
                _script(block, code),
                cwd=run.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        return
    # Output goes to a file, not a pipe: a process the block left running (`cmd &`) would hold a pipe open.
    output = run.folder / ".docs-block.log"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            _script(block, code),
            cwd=run.folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        _stop_group(proc, grace=0)
        message = f"{block.ident} ({attempt}) did not end within {BLOCK_TIMEOUT} s:\n"
        raise AssertionError(message + output.read_text(errors="replace")[-4000:]) from None
    finally:
        _stop_group(proc, grace=0)  # what a block left running in the background (`cmd &`) goes with it
    out = output.read_bytes()
    with_background = "".join(
        f"\n--- background block's log ({p.name}):\n{p.read_text(errors='replace')[-2000:]}"
        for p in sorted(run.folder.glob(".docs-background-*.log"))
    )
    assert proc.returncode == 0, (
        f"{block.ident} ({attempt}) exited {proc.returncode}:\n--- block:\n{code}--- output:\n"
        f"{out.decode(errors='replace')[-6000:]}{with_background}"
    )


def _reset_postgres(page_blocks: list[Block]) -> None:
    """Drop the schemas a PostgreSQL page names (``?schema=NAME``) and their queues', so each run starts fresh."""
    url = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    names = {name for b in page_blocks for name in re.findall(r"[?&]schema=(\w+)", b.code)}
    if not url or not names:
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for name in sorted(names):
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}_queue" CASCADE')


def _page_run(page: str, factory: pytest.TempPathFactory) -> PageRun:
    if page not in RUNS:
        folder = factory.mktemp(re.sub(r"\W+", "-", page))
        for name in CLONE_LINKS:
            (folder / name).symlink_to(ROOT / name)
        RUNS[page] = PageRun(folder, ports=free_ports([b for b in RUN if b.page == page]))
        if any("postgres" in b.needs for b in RUN if b.page == page):
            _reset_postgres([b for b in RUN if b.page == page])
    return RUNS[page]


def _missing(block: Block) -> str | None:
    for need in block.needs:
        if not _has(need):
            return ENABLE[need]
    return None


@pytest.fixture(scope="session", autouse=True)
def _stop_everything() -> object:
    yield
    for run in RUNS.values():
        run.stop_background()


@pytest.mark.e2e
@pytest.mark.timeout(2 * BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize(
    "block", [pytest.param(b, id=b.ident, marks=pytest.mark.xdist_group(f"docs:{b.page}")) for b in RUN]
)
def test_docs_block_runs_twice(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The block (and, first, its page's earlier blocks) runs as written; run again, it works again."""
    run = _page_run(block.page, tmp_path_factory)
    try:
        for earlier in (b for b in RUN if b.page == block.page and b.line <= block.line):
            if earlier.line in run.done:
                continue
            if run.failed:
                pytest.fail(f"an earlier block of {block.page} failed ({run.failed}), so this one cannot run")
            if run.skipped:
                pytest.skip(run.skipped)
            missing = _missing(earlier)
            if missing:
                if os.environ.get("CI") == "true" and not NOT_IN_CI.intersection(earlier.needs):
                    run.failed = earlier.ident
                    pytest.fail(f"{earlier.ident} {missing} (CI must run it)")
                run.skipped = missing if earlier is block else f"{missing} (an earlier block of the page does)"
                pytest.skip(run.skipped)
            try:
                _run(earlier, run, "first run")
                # A block that talks to the local model runs once: its second run would cost minutes of model
                # time on two cores (it is written to succeed whatever the model answers, so it re-runs too).
                if not earlier.background and "llm" not in earlier.needs:
                    _run(earlier, run, "second run: re-running it must work too")
            except AssertionError:
                run.failed = earlier.ident
                raise
            run.done.add(earlier.line)
    finally:
        if LAST_OF_PAGE[block.page] == block.line:
            run.stop_background()


def test_a_block_run_by_another_test_names_a_test_that_reads_its_page() -> None:
    """``{test=PATH}``: the file exists and reads the page, so the block is really run somewhere."""
    for block in (b for b in BLOCKS if b.test):
        assert block.test is not None
        test = ROOT / block.test
        assert test.is_file(), f"{block.ident}: {block.test} does not exist"
        assert Path(block.page).name in test.read_text(encoding="utf-8"), f"{block.ident}: {block.test} never reads it"


def test_there_are_blocks_to_run() -> None:
    assert len(RUN) >= 20, [b.ident for b in RUN]
