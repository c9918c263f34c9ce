"""Reference pages generated from the code: the CLI from the Typer app, the settings from the config model.

``scripts/mkdocs_hooks.py`` puts them into the documentation site where a page says
``<!-- generated: cli -->`` or ``<!-- generated: settings -->``; ``python scripts/docs_reference.py cli``
(or ``settings``) prints the Markdown.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _typer_app() -> Any:
    """The Typer app behind the ``saucer`` console script (found through pyproject's entry point)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module_name = scripts["saucer"].split(":", 1)[0]
    module = importlib.import_module(module_name)
    app = getattr(module, "app", None)
    if app is None:
        raise RuntimeError(f"{module_name} (the saucer console script's module) has no Typer 'app'")
    return app


def cli_markdown() -> str:
    """Every command of ``saucer`` with its usage, arguments and options, from the Typer app itself."""
    import typer
    import typer.cli
    import typer.main

    command = typer.main.get_command(_typer_app())
    ctx = typer.Context(command, info_name="saucer")
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="saucer", title="saucer")
    # One level below the page's own title; commands' help is plain text, so no markup leaks in.
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M).strip() + "\n"


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return re.sub(r"<class '([^']+)'>", r"\1", text).replace("pathlib.", "").replace("NoneType", "None")


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if hasattr(value, "model_dump"):
        return "(see below)"
    return f"`{value!r}`" if value not in ("", None) else ("`None`" if value is None else '`""`')


def settings_markdown() -> str:
    """One table per section of :class:`saucer.config.Settings`: key, type, default, environment variable, meaning."""
    from pydantic import BaseModel

    from saucer.config import ENV_PREFIX, Settings

    out: list[str] = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        doc = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else ""
        out += [
            f"### `[{section}]`",
            "",
            doc,
            "",
            "| key | type | default | environment | meaning |",
            "|---|---|---|---|---|",
        ]
        for name, sub in model.model_fields.items():
            env = f"`{ENV_PREFIX}{section.upper()}__{name.upper()}`"
            meaning = (sub.description or "").replace("|", "\\|").replace("\n", " ")
            kind = _type_name(sub.annotation).replace("|", "\\|")
            out.append(
                f"| `{section}.{name}` | `{kind}` | {_default(sub).replace('|', chr(92) + '|')} | {env} | {meaning} |"
            )
        out.append("")
    return "\n".join(out)


GENERATORS = {"cli": cli_markdown, "settings": settings_markdown}

if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
