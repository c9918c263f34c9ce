"""``make llm`` and ``make demo-llm`` say what the default local model can and cannot do before the
build that can take 20 minutes (issue 33, item 3: "the docs say so before the user spends 20 minutes")."""

from __future__ import annotations

import pytest
from scripts import (
    demo_llm,  # make demo-llm
    llama_server,  # make llm
)


class _Built(Exception):
    """Raised where the build would start."""


def _no_build() -> None:
    raise _Built


@pytest.mark.parametrize(
    "start", [lambda: llama_server.main(["--serve"]), lambda: demo_llm.main([])], ids=["make llm", "make demo-llm"]
)
def test_the_warning_comes_before_the_build(start, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # demo_llm imports llama_server as its sibling script (a module object of its own): patch both.
    for module in (llama_server, demo_llm.llama_server):
        monkeypatch.setattr(module, "fetch_model", _no_build)
        monkeypatch.setattr(module, "build_server", _no_build)
    with pytest.raises(_Built):
        start()
    out = capsys.readouterr().out
    assert out.startswith(llama_server.MODEL_WARNING)
    assert "of 5 runs finished" in out and "7B-class model" in out  # the measured figure, and what to use
