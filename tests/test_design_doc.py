"""docs/design.md names every module of src/saucer by its role, so the map agrees with the code."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "saucer"


def _named(design: str, path: Path) -> bool:
    rel = path.relative_to(PACKAGE)
    if path.name == "__init__.py" and len(rel.parts) > 1:  # a package is named by its folder
        return f"**{rel.parts[0]}**" in design or f"`{rel.parent.name}/`" in design
    return f"`{path.name}`" in design or f"`{rel}`" in design or f"{rel.parent}/{path.name}" in design


def test_design_names_every_module() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    missing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE) != Path("__init__.py") and not _named(design, p)
    ]
    assert not missing, "docs/design.md does not name these modules (say what each is for):\n" + "\n".join(missing)
