"""A plan file nested 100,000 deep is a one-sentence error of ``saucer run --plan``, not a RecursionError traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"task": "t", "steps": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"task": "t", "steps": [{"tool": "files.read", "parameters": ' + "[" * 2000 + "]" * 2000 + "}]}",
    ],
    ids=["array", "steps", "parameters"],
)
def test_a_deeply_nested_plan_is_one_sentence(tmp_path: Path, run_cli: Callable[..., Any], text: str) -> None:
    (tmp_path / "deep.json").write_text(text)
    done = run_cli("run", "--plan", "deep.json", "--store", f"sqlite:///{tmp_path}/s.db")
    assert done.returncode != 0 and "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert done.stderr.strip() == "error: plan file deep.json nests lists or objects too deeply to be a plan"
