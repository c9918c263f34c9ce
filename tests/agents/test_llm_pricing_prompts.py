"""Price table and prompt templating."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from saucer.agents.llm.pricing import PriceFileError, PriceTable, format_cost
from saucer.agents.llm.prompts import HIDDEN, render_template, template_variables
from saucer.context import Context


def test_shipped_table_prices_known_models() -> None:
    table = PriceTable.shipped()
    assert "gpt-4o" in table and "gpt-4o-mini" in table
    assert table.cost("gpt-4o", 1_000_000, 1_000_000) == pytest.approx(12.5)


def test_dated_and_provider_prefixed_names_use_the_family_price() -> None:
    table = PriceTable.shipped()
    assert table.cost("gpt-4o-2024-08-06", 1000, 0) == table.cost("gpt-4o", 1000, 0)
    assert table.cost("openai/gpt-4o-mini", 1000, 0) == table.cost("gpt-4o-mini", 1000, 0)
    assert table.cost("gpt-4-0613", 1000, 0) == table.cost("gpt-4", 1000, 0)


def test_unknown_model_is_none_and_prints_unknown() -> None:
    table = PriceTable.shipped()
    assert table.cost("llama3.1:8b", 10, 10) is None
    assert table.cost("gpt-4o-audio-preview", 10, 10) is None  # no guessing by prefix
    assert format_cost(None) == "unknown"
    assert format_cost(0.0) == "$0.000000"


def test_override_file_json(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"models": {"gpt-4o": {"input": 1, "output": 1}, "mine": {"input": 0, "output": 0}}}))
    table = PriceTable.load(f)
    assert table.cost("gpt-4o", 1_000_000, 0) == 1.0
    assert table.cost("mine", 5, 5) == 0.0
    assert "gpt-4o-mini" in table  # shipped entries stay


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"models": {"m": {"input": 1}}}', "models.m.output is missing"),
        ('{"models": {"m": {"input": -1, "output": 1}}}', "models.m.input must be a non-negative number"),
        ('{"models": {"m": {"input": 1, "output": 1, "outptu": 2}}}', "unknown field(s) outptu"),
        ('{"nope": 1}', "top-level 'models' table"),
        ("{broken", "not valid JSON"),
    ],
)
def test_bad_price_files_name_the_file_and_entry(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(PriceFileError) as info:
        PriceTable.load(f)
    assert message in str(info.value) and str(f) in str(info.value)


def test_missing_price_file(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match="does not exist"):
        PriceTable.load(tmp_path / "nope.toml")


# --------------------------------------------------------------- templating


def test_render_variables_dotted_paths_and_escapes() -> None:
    out = render_template(
        'Hi {user}, in {project.name}; keep {{literal}} and {unknown} and {"json": 1}',
        {"user": "ada", "project": {"name": "saucer"}},
    )
    assert out == 'Hi ada, in saucer; keep {literal} and {unknown} and {"json": 1}'


def test_non_string_values_render_as_json() -> None:
    assert render_template("{n} {items}", {"n": 3, "items": ["a", "b"]}) == '3 ["a", "b"]'


def test_hidden_vars_never_render() -> None:
    variables = {"token": "s3cr3t", "_internal": "x", "cfg": {"password": "p"}, "ok": "fine"}
    out = render_template("{token} {_internal} {cfg.password} {ok}", variables, hidden={"token", "cfg"})
    assert out == f"{HIDDEN} {HIDDEN} {HIDDEN} fine"
    assert "s3cr3t" not in out and "p" not in out.replace(HIDDEN, "").replace("fine", "")


def test_template_variables_from_a_context() -> None:
    ctx = Context()
    ctx.set("REQUEST", "make tea")
    ctx.update_vars(set={"user": "ada", "api_token": "zzz"})
    variables = template_variables(ctx)
    assert variables["REQUEST"] == "make tea" and variables["user"] == "ada"
    assert "LOGGER" not in variables  # runtime-only names are never offered
    assert render_template("{user}: {REQUEST} {api_token}", variables, hidden={"api_token"}) == "ada: make tea [hidden]"
