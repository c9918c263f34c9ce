"""The JSON-lines log of model calls (``request.log``).

One JSON object per line, appended and flushed under a lock, so concurrent
agents of one session never interleave half lines. A logger either owns a file
(``LOG_PATH/request.log``) or forwards each line to a :class:`logging.Logger`
the engine put in the Context (``REQUEST_LOGGER``), so
that one file always has exactly one writer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel

from saucer.redaction import redact, redact_text

__all__ = ["JsonlLogger", "RequestLogger", "read_jsonl"]


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


class JsonlLogger:
    """Appends one JSON object per line to ``path``, or hands each line to ``logger``."""

    filename = "log.jsonl"
    context_logger_name = ""

    def __init__(self, path: str | Path | None = None, *, logger: logging.Logger | None = None) -> None:
        if (path is None) == (logger is None):
            raise ValueError("give exactly one of path or logger")
        self.path = Path(path) if path is not None else None
        self.logger = logger
        self._lock = threading.Lock()

    @classmethod
    def for_context(cls, context: Any) -> Self | None:
        """The engine's logger when it set one, else ``LOG_PATH/<filename>``, else None (no log)."""
        if cls.context_logger_name:
            try:
                logger = context.get(cls.context_logger_name)
            except (KeyError, AttributeError):
                logger = None
            if isinstance(logger, logging.Logger):
                return cls(logger=logger)
        try:
            log_path = context.get("LOG_PATH")
        except (KeyError, AttributeError):
            log_path = None
        if log_path:
            return cls(Path(log_path) / cls.filename)
        return None

    def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``record`` (with ``time`` and ``timestamp`` added) as one line; return what was written."""
        now = time.time()
        full = redact({"time": datetime.fromtimestamp(now, UTC).isoformat(), "timestamp": now, **record})
        # default= turns objects into text; that text is redacted too.
        line = redact_text(json.dumps(full, ensure_ascii=False, default=_default))
        with self._lock:
            if self.logger is not None:
                self.logger.info(line)
            else:
                assert self.path is not None
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
                    fh.flush()
        return full


class RequestLogger(JsonlLogger):
    """``request.log``: one line per model call (prompt, response, tokens, cost, latency)."""

    filename = "request.log"
    context_logger_name = "REQUEST_LOGGER"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
