"""`saucer serve` reports a configuration mistake as one line, never a traceback."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path


def test_serve_with_an_admin_that_has_no_token_is_one_line_error(
    tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    (tmp_path / "saucer.toml").write_text('[service]\nadmins = ["[bold]ghost[/bold]"]\n')
    proc = run_cli("serve", "--port", "0", env={"SAUCER_SERVICE_TOKENS": "alice=" + "a" * 24}, timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    # Printed literally: the markup-like principal name stays as written.
    assert "service.admins names '[bold]ghost[/bold]'" in lines[0]
    assert "principals with tokens: alice" in lines[0]
    assert "Traceback" not in proc.stderr
