"""The docs harness itself: fence options are read or refused by name, and a failing snippet fails."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from docs_blocks import ROOT, BlockSyntaxError, parse
from test_docs_snippets import PageRun, _run, free_ports


def _page(tmp_path: Path, text: str) -> Path:
    if not (tmp_path / ".venv").exists():
        (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # as a page's folder has it: python and saucer on PATH
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return page


def test_blocks_and_their_options_are_read(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "# t\n\n```bash {needs=postgres,root}\necho a\n```\n\n```python\nprint(1)\n```\n\n"
        "```text\nout\n```\n\n````markdown\n```bash\nnot a block of its own\n```\n````\n\n"
        "```bash {background}\nsleep 1\n```\n\n```sh {test=tests/x.py}\nls\n```\n",
    )
    blocks = parse(page)
    assert [(b.language, b.line, b.runnable) for b in blocks] == [
        ("bash", 3, True),
        ("python", 7, True),
        ("text", 11, False),
        ("markdown", 15, False),
        ("bash", 21, True),
        ("sh", 25, True),
    ]
    assert blocks[0].needs == ("postgres", "root") and blocks[0].code == "echo a\n"
    assert "```bash\nnot a block" in blocks[3].code  # a fence inside a longer fence is text
    assert blocks[4].background and blocks[5].test == "tests/x.py"


@pytest.mark.parametrize(
    ("fence", "message"),
    [
        ("```bash {nedds=postgres}", "unknown option 'nedds'"),
        ("```bash {needs=postgress}", "unknown need 'postgress'"),
        ("```bash needs=postgres", "options go in braces"),
    ],
)
def test_a_bad_option_is_refused_naming_the_page_and_line(tmp_path: Path, fence: str, message: str) -> None:
    page = _page(tmp_path, f"# t\n\n{fence}\necho a\n```\n")
    with pytest.raises(BlockSyntaxError, match=message) as raised:
        parse(page)
    assert "page.md:3" in str(raised.value)


def test_an_unclosed_fence_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BlockSyntaxError, match="page.md:1: the fence is never closed"):
        parse(_page(tmp_path, "```bash\necho a\n"))


@pytest.mark.parametrize(
    "code",
    ['echo "$UNDEFINED_IN_THE_DOCS"\n', "false\necho never\n", "false | cat\n"],
    ids=["undefined-variable", "failing-command", "failing-pipe"],
)
def test_a_failing_shell_snippet_fails(tmp_path: Path, code: str) -> None:
    [block] = parse(_page(tmp_path, f"```bash\n{code}```\n"))
    with pytest.raises(AssertionError, match="exited 1"):
        _run(block, PageRun(tmp_path), "first run")


def test_a_python_snippet_with_an_undefined_name_fails(tmp_path: Path) -> None:
    [block] = parse(_page(tmp_path, "```python\nprint(undefined_in_the_docs)\n```\n"))
    with pytest.raises(AssertionError, match="NameError"):
        _run(block, PageRun(tmp_path), "first run")


def test_exports_carry_to_the_next_block_of_the_page(tmp_path: Path) -> None:
    first, second = parse(_page(tmp_path, '```bash\nexport GREETING=hi\n```\n\n```bash\ntest "$GREETING" = hi\n```\n'))
    run = PageRun(tmp_path)
    _run(first, run, "first run")
    _run(second, run, "first run")


def test_nothing_a_block_started_outlives_it(tmp_path: Path) -> None:
    [block] = parse(_page(tmp_path, "```bash\nsleep 300 &\necho $! > sleeper.pid\n```\n"))
    _run(block, PageRun(tmp_path), "first run")
    pid = int((tmp_path / "sleeper.pid").read_text())
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the block's background sleep {pid} still runs")


def test_a_background_block_is_stopped_with_its_children(tmp_path: Path) -> None:
    [block] = parse(_page(tmp_path, "```bash {background}\nsleep 300 &\necho $! > sleeper.pid\nwait\n```\n"))
    run = PageRun(tmp_path)
    _run(block, run, "first run")
    for _ in range(50):
        if (tmp_path / "sleeper.pid").exists() and (tmp_path / "sleeper.pid").read_text().strip():
            break
        time.sleep(0.1)
    pid = int((tmp_path / "sleeper.pid").read_text())
    assert Path(f"/proc/{pid}").exists()  # it runs while the page's later blocks would
    run.stop_background()
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_port_the_page_fixes_is_replaced_by_a_free_one(tmp_path: Path) -> None:
    """A server already listening on the documented port (a reader's own) cannot answer in the page's place."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        blocks = parse(
            _page(tmp_path, f"```bash\necho serve --port {port} > said\n```\n\n```bash\necho :{port}/ws >> said\n```\n")
        )
        run = PageRun(tmp_path, ports=free_ports(blocks))
        for block in blocks:
            _run(block, run, "first run")
    free = run.ports[port]
    assert free != port and (tmp_path / "said").read_text() == f"serve --port {free}\n:{free}/ws\n"
