"""MkDocs hooks (mkdocs.yml ``hooks:``): generated reference sections, put in at build time.

A page line ``<!-- generated: cli -->`` becomes the CLI reference made from the Typer app, and
``<!-- generated: settings -->`` the settings tables made from the config model
(``scripts/docs_reference.py``), so the reference cannot fall behind the code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_reference  # noqa: E402  (a sibling script, found through the path set above)

MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with the output of that generator."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in docs_reference.GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown generated section {name!r}")
        return docs_reference.GENERATORS[name]()

    return MARKER.sub(generate, markdown)
