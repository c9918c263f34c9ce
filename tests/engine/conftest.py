"""Fixtures for the engine tests: settings on an in-memory store, logs under tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from saucer.config import Settings, load_settings


@pytest.fixture
def make_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Settings]:
    """``make_settings(**dotted_overrides)``: memory store, logs in tmp_path, no prompts."""
    monkeypatch.chdir(tmp_path)
    for var in list(__import__("os").environ):
        if var.startswith("SAUCER_") and not var.startswith("SAUCER_TEST"):
            monkeypatch.delenv(var)

    def make(**overrides: Any) -> Settings:
        base = {
            "store.url": "memory://",
            "logs.root": str(tmp_path / "logs"),
            "system.save_experience": "always_not",
        }
        base.update({k.replace("__", "."): v for k, v in overrides.items()})
        return load_settings(overrides=base)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()
