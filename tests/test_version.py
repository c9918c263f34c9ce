"""The version is said once per surface and the surfaces agree; the changelog names it."""

import tomllib
from pathlib import Path

import saucer

ROOT = Path(__file__).resolve().parent.parent


def test_package_version_matches_pyproject_and_changelog() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert saucer.__version__ == project["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {saucer.__version__} " in changelog, "CHANGELOG.md has no entry for the package's version"


def test_changelog_names_the_current_formats() -> None:
    """The newest release entry names the record format this code writes."""
    from saucer.store.upcast import FORMAT_VERSION

    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = changelog.split(f"## {saucer.__version__} ", 1)[1].split("\n## ", 1)[0]
    assert f"Record format {FORMAT_VERSION}" in newest
