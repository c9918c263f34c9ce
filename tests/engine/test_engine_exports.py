"""``saucer.engine``'s public names, loaded on first access: each is its module's own object."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import saucer.engine as engine


def test_every_public_name_is_its_modules_object() -> None:
    assert engine.__all__ == sorted(engine._EXPORTS)
    for name, module in engine._EXPORTS.items():
        assert getattr(engine, name) is getattr(importlib.import_module(module), name), name


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Sesion'"):
        engine.Sesion  # noqa: B018
    from saucer.engine import defaults, experience

    assert defaults.__name__ == "saucer.engine.defaults" and experience.__name__ == "saucer.engine.experience"


def test_importing_one_name_loads_only_its_module() -> None:
    probe = "import sys; from saucer.engine import SessionFactory; print(sorted(m for m in ('saucer.engine.routing', 'saucer.engine.pool') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
