"""The fenced blocks of README.md and docs/, and what their fence's info string asks of the docs tests.

A fence's info string is the block's language, optionally followed by options in braces, which MkDocs
(pymdownx.superfences) and GitHub both render as a plain block of that language::

    ```bash {needs=postgres}          run only where PostgreSQL is (SAUCER_TEST_POSTGRES_URL)
    ```bash {needs=desktop,root}      several needs, all required
    ```bash {background}              started and left running until the page's last block has run
    ```bash {test=tests/x/test_y.py}  run by that test instead (it reads the block from the page)

Shell (``bash``, ``sh``) and Python (``python``) blocks are run; every other language (``text``, ``json``,
``toml``, ``yaml``, ``mermaid``...) is data or output and is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL = frozenset({"bash", "sh", "shell"})
PYTHON = frozenset({"python", "py"})
#: What a ``needs=`` may name: each is checked by tests/docs/test_docs_snippets.py.
NEEDS = frozenset({"postgres", "llm", "desktop", "chromium", "root", "openai"})
#: Needs that CI does not have, so their blocks are skipped there too (every other need must be met in CI).
NOT_IN_CI = frozenset({"openai"})
OPTIONS = frozenset({"needs", "background", "test"})
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")


class BlockSyntaxError(ValueError):
    """A fence whose options cannot be read: the page and line are in the message."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, its options and its text."""

    page: str  # relative to the repository, e.g. "docs/tutorials/queue.md"
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    needs: tuple[str, ...] = ()
    background: bool = False
    test: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def runnable(self) -> bool:
        """Whether the docs tests run this block (shell or Python)."""
        return self.language in SHELL or self.language in PYTHON

    @property
    def ident(self) -> str:
        return f"{self.page}:{self.line}"


def _options(text: str, where: str) -> dict[str, str]:
    text = text.strip()
    if not text:
        return {}
    if not (text.startswith("{") and text.endswith("}")):
        raise BlockSyntaxError(f"{where}: options go in braces after the language, e.g. ```bash {{needs=postgres}}")
    found: dict[str, str] = {}
    for word in text[1:-1].split():
        key, _, value = word.partition("=")
        if key not in OPTIONS:
            raise BlockSyntaxError(f"{where}: unknown option {key!r} (known: {', '.join(sorted(OPTIONS))})")
        found[key] = value.strip("\"'")
    for need in filter(None, found.get("needs", "").split(",")):
        if need not in NEEDS:
            raise BlockSyntaxError(f"{where}: unknown need {need!r} (known: {', '.join(sorted(NEEDS))})")
    return found


def parse(page: Path) -> list[Block]:
    """Every fenced block of ``page`` in order (a fence inside another is text of the outer block)."""
    resolved = page.resolve()
    rel = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group("fence"), opening.group("info").strip()
        language, _, rest = info.partition(" ")
        if "{" in language:  # ```bash{...}
            language, rest = language.split("{", 1)[0], "{" + language.split("{", 1)[1] + rest
        where = f"{rel}:{i + 1}"
        options = _options(rest, where)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(fence[0])
        ):
            body.append(lines[j])
            j += 1
        if j == len(lines):
            raise BlockSyntaxError(f"{where}: the fence is never closed")
        blocks.append(
            Block(
                page=rel,
                line=i + 1,
                language=language.lower(),
                code="\n".join(body) + "\n",
                needs=tuple(filter(None, options.get("needs", "").split(","))),
                background="background" in options,
                test=options.get("test") or None,
                options=options,
            )
        )
        i = j + 1
    return blocks


def pages() -> list[Path]:
    """README.md and every Markdown page of docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_blocks(rel: str) -> list[Block]:
    """The blocks of one page, by its path relative to the repository (for tests that run a page's block)."""
    return parse(ROOT / rel)


def _report() -> None:
    """Print how many blocks there are, how many run, and which are marked and why."""
    everything = [b for page in pages() for b in parse(page)]
    runnable = [b for b in everything if b.runnable]
    marked = [b for b in runnable if b.needs or b.test or b.background]
    print(f"{len(everything)} fenced blocks in {len(pages())} pages; {len(runnable)} shell or Python blocks")
    in_ci = [b for b in runnable if not b.test and not NOT_IN_CI.intersection(b.needs)]
    print(f"  {sum(1 for b in runnable if not b.needs and not b.test)} run everywhere (make test)")
    print(f"  {sum(1 for b in runnable if b.needs)} run only where their needs are")
    print(f"  {sum(1 for b in runnable if b.test)} run by a test of their own (which CI runs)")
    print(
        f"  {len(in_ci)} run by the docs harness in CI; never in CI: {sum(1 for b in runnable if NOT_IN_CI.intersection(b.needs))}"
    )
    for b in marked:
        what = ", ".join(
            [f"needs={','.join(b.needs)}"] * bool(b.needs)
            + ["background"] * b.background
            + [f"test={b.test}"] * bool(b.test)
        )
        print(f"  {b.ident}: {what}")


if __name__ == "__main__":
    _report()
