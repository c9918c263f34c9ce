"""The JSON schemas of a tool table, cached beside its source like bytecode.

Listing a tool means its input schema (from a pydantic model of its
parameters) and its output schema (from its result model): building those
models and their schemas for the seven built-in tools costs tens of
milliseconds, on every process start, for data that follows from the source
alone. A :class:`~saucer.tools.native.NativeServer` given ``schema_sources``
keeps them in ``__pycache__/<module>.<server>.tool-schemas.json`` beside the
first source file, the way Python keeps ``.pyc`` files there:

* the file is valid for one exact set of inputs: the bytes of every source
  file and of every other module in their folders (a result model moved to a
  sibling module is still seen, without a list kept by hand), the pydantic and
  Python versions and this format's version; a tool's
  entry also depends on its name, function, annotations, defaults and result
  model. Anything else and the schemas are computed again and the file rewritten;
* it is written atomically (a temporary file renamed over it), never when
  Python is told not to write bytecode (``-B``, ``PYTHONDONTWRITEBYTECODE``),
  and a folder that cannot be written (a system-wide install) only means no
  cache; a file that cannot be read or parsed is ignored and replaced.

Whoever can write that folder can already replace the ``.pyc`` files in it,
so the cache trusts nothing they could not already change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SchemaCache", "tool_key"]

_FORMAT = 1
_log = logging.getLogger(__name__)

Schemas = dict[str, Any]  # {"inputSchema": {...}, "outputSchema": {...}}


def tool_key(name: str, fn: Callable[..., Any], output: type) -> str:
    """What one tool's schemas follow from besides the source files: its name, function and result model."""
    material = [
        name,
        fn.__module__,
        fn.__qualname__,
        repr(getattr(fn, "__annotations__", None)),
        repr(getattr(fn, "__defaults__", None)),
        repr(getattr(fn, "__kwdefaults__", None)),
        output.__module__,
        output.__qualname__,
    ]
    return hashlib.sha256(json.dumps(material).encode("utf-8", "surrogatepass")).hexdigest()


class SchemaCache:
    """The cached schemas of one server's tools, read once, written when a tool was missing."""

    def __init__(self, server: str, sources: Sequence[str | os.PathLike[str]]) -> None:
        self.path: Path | None = None
        self.key = ""
        self.entries: dict[str, Schemas] = {}
        self._dirty = False
        if not sources:
            return
        try:
            import pydantic

            digest = hashlib.sha256(f"{_FORMAT}\0{sys.version}\0{pydantic.VERSION}".encode())
            given = [Path(source) for source in sources]
            siblings = sorted({module for folder in {p.parent for p in given} for module in folder.glob("*.py")})
            for source in dict.fromkeys([*given, *siblings]):  # ~0.2 ms for saucer.tools' eleven modules
                digest.update(b"\0" + str(source).encode("utf-8", "surrogateescape") + b"\0" + source.read_bytes())
        except OSError as exc:  # a source that cannot be read (a zip import...): no cache
            _log.debug("tool schemas of %s are not cached: %s", server, exc)
            return
        first = Path(sources[0])
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in server)
        self.path = first.parent / "__pycache__" / f"{first.stem}.{safe}.tool-schemas.json"
        self.key = digest.hexdigest()
        self.entries = self._read()

    def _read(self) -> dict[str, Schemas]:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            _log.debug("tool schema cache %s is unreadable, computing again: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("key") != self.key or not isinstance(data.get("tools"), dict):
            return {}
        return {
            key: entry
            for key, entry in data["tools"].items()
            if isinstance(entry, dict)
            and isinstance(entry.get("inputSchema"), dict)
            and isinstance(entry.get("outputSchema"), dict | None)
        }

    def get(self, key: str, compute: Callable[[], Schemas]) -> Schemas:
        """The schemas for tool ``key``, from the cache or from ``compute()`` (then kept to be written)."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = compute()
            self._dirty = self.path is not None
        return entry

    def save(self) -> None:
        """Write the file when something was computed (not under ``-B``; an unwritable folder is skipped)."""
        if not self._dirty or self.path is None or sys.dont_write_bytecode:
            return
        self._dirty = False
        try:
            self.path.parent.mkdir(exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=self.path.name, suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump({"key": self.key, "tools": self.entries}, out)
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as exc:
            _log.debug("tool schema cache %s not written: %s", self.path, exc)
