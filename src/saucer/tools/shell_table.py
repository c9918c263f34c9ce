"""The in-process shell tool, listed without importing its implementation.

A session lists its tools when it starts; most one-step sessions never run a
command. :func:`create_server` (the default ``import_path`` of the in-process
``shell``) checks the options as :func:`saucer.tools.shell.create_server` does
and returns a :class:`LazyShellServer`: its listing is made from the options
(:mod:`saucer.tools.shell_options`) and from the tool's JSON schemas kept in
``shell_schema.json`` beside this module; the implementation
(:mod:`saucer.tools.shell`, the running of commands, its result model) is
imported on the first call, and the call goes to its table. A test compares
the kept schemas and the whole listing with what the implementation builds, so
they cannot drift apart unseen; ``python -m saucer.tools.shell_table``
writes the file again.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from saucer.tools.native import NativeServer, ToolOutcome, ToolSpec
from saucer.tools.shell_options import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_TIMEOUT,
    DEFAULT_TIMEOUT,
    RUN_HINTS,
    RUN_TITLE,
    SERVER_NAME,
    ShellOptions,
    describe,
    instructions,
    prepare,
)

__all__ = ["LazyShellServer", "SCHEMA_FILE", "create_server", "kept_schemas"]

#: The input and output JSON schemas of the ``run`` tool, as the implementation builds them.
SCHEMA_FILE = Path(__file__).with_name("shell_schema.json")
_schemas: dict[str, Any] | None = None


def kept_schemas() -> dict[str, Any]:
    """``{"inputSchema": ..., "outputSchema": ...}`` of ``run``, read once from :data:`SCHEMA_FILE`."""
    global _schemas
    if _schemas is None:
        _schemas = json.loads(SCHEMA_FILE.read_bytes())
    return _schemas


class LazyShellServer(NativeServer):
    """The shell's tool table for ``options``: listed from the kept schemas, called through the implementation.

    ``key`` is what the implementation's table is shared by (:func:`saucer.tools._common.built_once`),
    so sessions with the same options call one table whichever way they reached it.
    """

    def __init__(self, options: ShellOptions, key: dict[str, Any]) -> None:
        # NativeServer's own state is the loaded table's; nothing of it is set up here.
        self.name = SERVER_NAME
        self.instructions = instructions(options)
        self.schema_sources = ()
        self.options = options
        self._key = key
        self._table: NativeServer | None = None
        self._lock = threading.Lock()

    def loaded(self) -> NativeServer:
        """The implementation's table for these options (imports :mod:`saucer.tools.shell` the first time)."""
        table = self._table
        if table is None:
            with self._lock:
                if self._table is None:
                    from saucer.tools import shell

                    self._table = shell.shared_table(self.options, self._key)
                table = self._table
        return table

    @property
    def tools(self) -> dict[str, ToolSpec]:
        """The loaded table's specs: who walks them (an MCP server made of this table) needs the implementation."""
        return self.loaded().tools

    @tools.setter
    def tools(self, value: dict[str, ToolSpec]) -> None:
        raise AttributeError("the shell's tools are its implementation's")

    def list_tools(self) -> list[dict[str, Any]]:
        """The listing, as :meth:`NativeServer.list_tools` of the implementation gives it (a test compares them)."""
        schemas = json.loads(json.dumps(kept_schemas()))  # a caller may change what it gets
        return [
            {
                "name": "run",
                "title": RUN_TITLE,
                "description": describe(self.options),
                **schemas,
                "annotations": ToolSpec.hints_as_annotations("run", RUN_HINTS) or None,
            }
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call ``name`` on the implementation's table (imported now when it was not yet)."""
        return await self.loaded().call_tool(name, arguments)


def create_server(
    root: str | os.PathLike[str] = ".",
    *,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    max_output: int = DEFAULT_MAX_OUTPUT,
    timeout: float = DEFAULT_TIMEOUT,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    shell: str = "/bin/sh",
    env: Mapping[str, str] | None = None,
    sandbox: str = "auto",
    write: Sequence[str] = (),
    read: Sequence[str] = ("/",),
    network: bool | Sequence[int] = True,
) -> NativeServer:
    """:func:`saucer.tools.shell.create_server` (the same options, checked the same way, the same
    listing and results) without importing the implementation until a command runs."""
    options, key = prepare(
        root,
        allow=allow,
        deny=deny,
        max_output=max_output,
        timeout=timeout,
        max_timeout=max_timeout,
        shell=shell,
        env=env,
        sandbox=sandbox,
        write=write,
        read=read,
        network=network,
    )
    return LazyShellServer(options, key)


def main() -> int:
    """Write :data:`SCHEMA_FILE` from the implementation (after a change to the tool's parameters or result)."""
    from saucer.tools import shell

    SCHEMA_FILE.write_text(json.dumps(shell.built_schemas(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
