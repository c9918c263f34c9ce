"""The quick parameter check says "valid" only where jsonschema does, and leaves every message to jsonschema."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest

from saucer.dispatch.toolcheck import ParameterCheck, _quick_check, command_problem, parameter_problem, schema_validator
from saucer.tools import files, shell

SCHEMAS: list[Any] = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"n": {"type": "number"}, "b": {"type": "boolean"}, "s": {"type": "string"}}},
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}}},
    {
        "type": "object",
        "properties": {
            "e": {"anyOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "null"}]}
        },
    },
    {"type": "object", "properties": {"l": {"type": "array", "items": {"type": "integer"}}}},
    {"type": ["object", "null"], "properties": {"t": {"type": ["string", "integer"]}}, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}},  # a keyword it does not know
    {"type": "object", "properties": {"a": {"type": "integer"}}, "$schema": "http://json-schema.org/draft-07/schema#"},
    {"type": "object", "properties": {"a": {"type": "integr"}}},  # an invalid schema
    {"type": "object", "required": ["a", "a"]},  # invalid: required items are unique
    {"type": "object", "title": 5},  # invalid: a title is a string
    {"anyOf": []},  # invalid: anyOf is not empty
    {"type": "object", "properties": {"a": True}},
]

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -3,
    2**70,
    1.0,
    1.5,
    float("nan"),
    "",
    "x",
    "[1]",
    [],
    [1, 2],
    [1, "a"],
    [True],
    {},
    {"k": "v"},
    {"k": 1},
    {1: "v"},
]


def _instances() -> list[Any]:
    out: list[Any] = [{}, [], "x", None]
    for key in ("a", "n", "b", "s", "x", "e", "l", "t", "z"):
        out += [{key: value} for value in VALUES]
    out += [{"a": 1, "z": 2}, {"n": 1, "b": True, "s": "s"}]
    return out


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: str(s)[:60])
def test_the_quick_check_agrees_with_jsonschema(schema: Any) -> None:
    validator = schema_validator(schema)
    quick = _quick_check(schema)
    if validator is None:
        assert quick is None  # an invalid schema is never taken by the quick check
        return
    for instance, check in itertools.product(_instances(), [ParameterCheck(schema)]):
        expected = parameter_problem(validator, instance) if isinstance(instance, dict) else None
        if quick is not None and quick(instance):
            assert not list(validator.iter_errors(instance)), (schema, instance)
        if isinstance(instance, dict):
            assert check.problem(instance) == expected, (schema, instance)


def test_the_built_in_tools_schemas_are_all_taken_by_the_quick_check(tmp_path) -> None:
    tables = [
        files.tool_table(files.FilesOptions.create(tmp_path)),
        shell.tool_table(shell.ShellOptions.create(tmp_path)),
    ]
    listed = [tool for table in tables for tool in table.list_tools()]
    assert len(listed) == 7
    for tool in listed:
        assert _quick_check(tool["inputSchema"]) is not None, tool["name"]
        jsonschema.Draft202012Validator.check_schema(tool["inputSchema"])


def test_messages_are_jsonschemas(tmp_path) -> None:
    [run] = shell.tool_table(shell.ShellOptions.create(tmp_path)).list_tools()
    tools = {"shell.run": {"input_schema": run["inputSchema"]}}
    assert command_problem("shell.run", {"command": "ls", "env": {"A": "b"}, "expect_exit": [0, 1]}, tools) is None
    assert command_problem("shell.run", {"command": 5}, tools) == (
        "invalid parameters for tool 'shell.run': 5 is not of type 'string' (at 'command')"
    )
    assert (
        command_problem("run", {}, tools) == "invalid parameters for tool 'shell.run': 'command' is a required property"
    )
    assert command_problem("shell.run", {"command": "ls", "env": {"A": 1}}, tools) == (
        "invalid parameters for tool 'shell.run': 1 is not of type 'string' (at 'env/A')"
    )
