"""The built-in tools without the MCP SDK: one tool table, served in-process as plain calls or over MCP.

A built-in server (``shell``, ``files``) is a :class:`NativeServer`: its tools
are :class:`ToolSpec` entries, async functions whose annotated parameters are
the tool's arguments. Two ways run the same table:

* in-process (the default): the dispatcher calls :meth:`NativeServer.call_tool`
  directly, without building an MCP server or importing the MCP SDK (whose
  import alone costs about a second of CPU, more than the rest of a short
  session);
* as an MCP server (``python -m saucer.tools.NAME``, or ``build_server``):
  :func:`saucer.tools._common.make_mcp_server` registers the same functions
  on an ``MCPServer``.

Both say the same: the listing (input schema from the parameters, output
schema from the result model, annotations) and every result are what the MCP
SDK's ``MCPServer`` makes of these functions, down to the error texts
(``Error executing tool NAME: ...``), the JSON pre-parsing of string
arguments and the argument model's name in a validation error. A test
compares the two listings and results, so a new SDK that changes them is seen.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import orjson

if TYPE_CHECKING:
    from pydantic import BaseModel, TypeAdapter

__all__ = ["ToolError", "ToolOutcome", "ToolSpec", "NativeServer"]

logger = logging.getLogger(__name__)

# The order MCP's ToolAnnotations dumps its fields in, with their JSON names.
_HINTS = (
    ("title", "title"),
    ("read_only", "readOnlyHint"),
    ("destructive", "destructiveHint"),
    ("idempotent", "idempotentHint"),
    ("open_world", "openWorldHint"),
)


class ToolError(Exception):
    """A tool call failed in a way its caller should read (a refused path, a missing file, a bad option).

    Its message becomes the error text of the call: ``Error executing tool NAME: MESSAGE``.
    Over MCP it is raised as the SDK's ``ToolError`` with the same message.
    """


@dataclass(frozen=True)
class ToolOutcome:
    """What one call produced, as MCP's ``CallToolResult`` carries it.

    ``text`` is the text content; ``structured`` the structured content (None
    when the tool has none); ``is_error`` marks a failed call, which may keep
    its data in ``structured`` (a command's exit code and output).
    """

    text: str
    structured: dict[str, Any] | None = None
    is_error: bool = False

    @property
    def payload(self) -> Any:
        """The JSON value of a successful call: its structured content, else its text."""
        return self.structured if self.structured is not None else self.text


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, its function and how it is described.

    ``fn`` is an async function whose parameters (annotated, with defaults
    for the optional ones) are the tool's arguments. It returns an instance of
    ``output`` (a pydantic model: the structured content), or a
    :class:`ToolOutcome` whose structured content, when the call succeeded,
    validates as ``output``. It raises :class:`ToolError` for a failure the
    caller should read; anything else is a crash, reported without its text.
    """

    name: str
    fn: Callable[..., Awaitable[Any]]
    output: type[BaseModel]
    description: str
    title: str | None = None
    #: Behaviour hints, as MCP's ToolAnnotations: title, read_only, destructive, idempotent, open_world.
    hints: dict[str, Any] = field(default_factory=dict)

    def annotations(self) -> dict[str, Any]:
        """The hints as MCP's ``ToolAnnotations`` in JSON (camelCase names, unset ones left out)."""
        return self.hints_as_annotations(self.name, self.hints)

    @staticmethod
    def hints_as_annotations(name: str, hints: dict[str, Any]) -> dict[str, Any]:
        """:meth:`annotations` of a tool ``name`` with these ``hints`` (a ValueError names an unknown hint)."""
        unknown = set(hints) - {key for key, _ in _HINTS}
        if unknown:
            raise ValueError(f"tool {name!r}: unknown hints {sorted(unknown)}")
        return {wire: hints[key] for key, wire in _HINTS if hints.get(key) is not None}


def _pre_parse_json(fields: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments given as JSON text for a parameter that is not a string, parsed (as MCPServer does)."""
    parsed = dict(arguments)
    for key, value in arguments.items():
        info = fields.get(key)
        if info is None or not isinstance(value, str) or info.annotation is str:
            continue
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if not isinstance(value, str | int | float):
            parsed[key] = value
    return parsed


class _Compiled:
    """A tool's argument model and output validator (pydantic, built on its first call or listing)."""

    def __init__(self, spec: ToolSpec) -> None:
        from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

        class ArgModelBase(BaseModel):
            """A model representing the arguments to a function."""

            model_config = ConfigDict(arbitrary_types_allowed=True)

        signature = inspect.signature(spec.fn, eval_str=True)
        params: dict[str, Any] = {}
        #: Field name -> the keyword the function takes (an alias when the name shadows a BaseModel method).
        self.keywords: dict[str, str] = {}
        for param in signature.parameters.values():
            if param.name.startswith("_"):
                raise ValueError(f"parameter {param.name} of {spec.fn.__name__} cannot start with '_'")
            annotation = param.annotation if param.annotation is not inspect.Parameter.empty else Any
            name, extra = param.name, {}
            if hasattr(BaseModel, name) and callable(getattr(BaseModel, name)):
                extra["alias"], name = name, f"field_{name}"
            # A type made at run time for create_model, which no static checker can follow.
            typed = Annotated[(annotation, Field(**extra))]  # type: ignore[valid-type]
            params[name] = (typed, param.default) if param.default is not inspect.Parameter.empty else typed
            self.keywords[name] = param.name
        self.arg_model: type[BaseModel] = create_model(f"{spec.fn.__name__}Arguments", __base__=ArgModelBase, **params)
        self.output: TypeAdapter[Any] = TypeAdapter(spec.output)
        self.fields = dict(self.arg_model.model_fields)
        for info in list(self.fields.values()):
            if info.alias:
                self.fields[info.alias] = info

    def schemas(self) -> dict[str, Any]:
        """The input and output JSON schemas, as MCPServer publishes them."""
        return {
            "inputSchema": self.arg_model.model_json_schema(by_alias=True),
            "outputSchema": self.output.json_schema(),
        }


class NativeServer:
    """The tools of one built-in server, called in-process without MCP; what an ``import_path`` factory returns.

    The dispatcher lists and calls them as it would an MCP server's
    (:meth:`list_tools`, :meth:`call_tool`); every outcome of a call is a
    :class:`ToolOutcome`, a crash included, as an MCP server answers it.
    """

    def __init__(
        self,
        name: str,
        instructions: str,
        tools: Sequence[ToolSpec],
        *,
        schema_sources: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        """``schema_sources``: the source files the tools' schemas follow from (the modules of
        their functions and result models; the other modules of their folders count too). Given,
        the schemas are cached beside the first one like bytecode (:mod:`saucer.tools._schemacache`),
        so a listing builds no model at all.
        """
        self.name = name
        self.instructions = instructions
        self.tools: dict[str, ToolSpec] = {}
        for spec in tools:
            if spec.name in self.tools:
                raise ValueError(f"server {name!r}: tool {spec.name!r} is defined twice")
            self.tools[spec.name] = spec
        self.schema_sources = tuple(schema_sources)
        self._compiled: dict[str, _Compiled] = {}
        self._schemas: dict[str, dict[str, Any]] = {}

    def _compiled_schemas(self, name: str) -> dict[str, Any]:
        return self._compile(name).schemas()

    def _compile(self, name: str) -> _Compiled:
        compiled = self._compiled.get(name)
        if compiled is None:
            compiled = self._compiled[name] = _Compiled(self.tools[name])
        return compiled

    def _tool_schemas(self) -> dict[str, dict[str, Any]]:
        if len(self._schemas) < len(self.tools):
            from saucer.tools._schemacache import SchemaCache, tool_key

            cache = SchemaCache(self.name, self.schema_sources)
            for name, spec in self.tools.items():
                key = tool_key(name, spec.fn, spec.output)
                # compiled only on a cache miss: compiling the argument and result models is the cost saved
                self._schemas[name] = cache.get(key, functools.partial(self._compiled_schemas, name))
            cache.save()
        return self._schemas

    def list_tools(self) -> list[dict[str, Any]]:
        """Every tool as MCP lists it: name, title, description, inputSchema, outputSchema, annotations.

        Each call returns new dicts (a caller may change them).
        """
        schemas = self._tool_schemas()
        listed = []
        for name, spec in self.tools.items():
            annotations = spec.annotations()
            listed.append(
                {
                    "name": name,
                    "title": spec.title,
                    "description": spec.description,
                    **orjson.loads(orjson.dumps(schemas[name])),  # a deep copy of JSON data, at C speed
                    "annotations": annotations or None,
                }
            )
        return listed

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call tool ``name``; a failure is an error outcome with MCPServer's text, never an exception."""
        from pydantic import BaseModel, ValidationError

        spec = self.tools.get(name)
        if spec is None:
            return ToolOutcome(f"Unknown tool: {name}", is_error=True)
        compiled = self._compile(name)
        try:
            model = compiled.arg_model.model_validate(_pre_parse_json(compiled.fields, arguments))
        except ValidationError as exc:
            logger.info("Tool %r rejected arguments", name)
            return ToolOutcome(f"Error executing tool {name}: {exc}", is_error=True)
        except Exception:  # noqa: BLE001 - a validator that raises is a crash, reported without its text
            logger.exception("Tool %r raised an unexpected exception", name)
            return ToolOutcome(f"Error executing tool {name}", is_error=True)
        kwargs = {compiled.keywords[key]: getattr(model, key) for key in type(model).model_fields}
        try:
            result = await spec.fn(**kwargs)
            if isinstance(result, ToolOutcome):
                if not result.is_error:
                    compiled.output.validate_python(result.structured)
                return result
            validated = compiled.output.validate_python(result, by_alias=True, by_name=True)
            if isinstance(validated, BaseModel):
                structured = validated.model_dump(mode="json", by_alias=True)
            else:
                structured = compiled.output.dump_python(validated, mode="json", by_alias=True)
            return ToolOutcome(_text(result), structured)
        except ToolError as exc:
            logger.info("Tool %r failed: %r", name, str(exc))
            return ToolOutcome(f"Error executing tool {name}: {exc}", is_error=True)
        except Exception:  # noqa: BLE001 - a crash: its text stays here, as an MCP server keeps it
            logger.exception("Tool %r raised an unexpected exception", name)
            return ToolOutcome(f"Error executing tool {name}", is_error=True)


def _text(result: Any) -> str:
    """The text content MCPServer makes of a returned value (JSON, indented by 2)."""
    import pydantic_core

    return result if isinstance(result, str) else pydantic_core.to_json(result, fallback=str, indent=2).decode()
