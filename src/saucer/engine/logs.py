"""Per-session log files and the one schema their writers and readers share.

Every session writes under ``LOG_PATH = <logs.root>/<task>/<session_id>/``:

- ``response.log``: JSONL, one :class:`StepRecord` per committed step;
- ``request.log``: JSONL, one :class:`RequestLogEntry` per model call (LLM agents);
- ``evaluation.log``: JSONL, one :class:`EvaluationLogEntry` per evaluation;
- ``session.log``: free text from ``context.get(ContextNames.LOGGER)``;
- ``output.md``: a readable timeline, when ``system.log_to_markdown`` is on;
- ``experience.json``: the session as a replayable plan, when saved.

A new session never writes into an old run's folder (a taken folder gets a
``-2``, ``-3``... suffix). A resumed session continues its own files; a step
is logged only after it is committed, so no step appears twice. Files are
opened lazily and kept open for the session's lifetime.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter

from saucer.engine.step_format import STEP_FORMAT, STEP_FORMAT_KEY, StepFormatError, upcast_step
from saucer.redaction import redact, redact_text

if TYPE_CHECKING:
    from saucer.engine.meta import StepRecordMeta

__all__ = [
    "StepRecord",
    "RequestLogEntry",
    "EvaluationLogEntry",
    "SessionLogs",
    "read_step_log",
    "read_request_log",
    "read_evaluation_log",
    "log_dir_for",
    "slug",
    "RESPONSE_LOG",
    "REQUEST_LOG",
    "EVALUATION_LOG",
    "MARKDOWN_LOG",
    "TEXT_LOG",
    "EXPERIENCE_FILE",
]

RESPONSE_LOG = "response.log"
REQUEST_LOG = "request.log"
EVALUATION_LOG = "evaluation.log"
MARKDOWN_LOG = "output.md"
TEXT_LOG = "session.log"
EXPERIENCE_FILE = "experience.json"

# Log files are raw descriptors written with os.write: one system call a line, no io objects (an
# io.FileIO in append mode adds an fstat and an lseek when opened). Each line is in the kernel when
# write_line returns, so a killed process loses none.
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
_REPLACE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a regular file takes it in one call unless interrupted or full)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return str(value)


def dumps(value: Any) -> bytes:
    """JSON bytes (``orjson``); objects that are not JSON become strings."""
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


def _no_items() -> list[Any]:
    """A new empty list. A function of saucer's, not ``list``: pydantic reads a default factory's
    signature, and reading the signature of a builtin type tokenizes its text (the first time in a
    process compiles tokenize's expressions: ~1.5% of a one-step run)."""
    return []


def _no_entries() -> dict[str, Any]:
    """A new empty dict (a function of saucer's, as :func:`_no_items`)."""
    return {}


@dataclass(slots=True)
class StepRecord:
    """One agent step: the line in ``response.log`` and the ``meta`` of the step's event.

    Both stored forms carry their step format (:mod:`saucer.engine.step_format`);
    :meth:`from_dict` and :func:`read_step_log` read every older one.

    ``step`` counts steps in the round and ``session_step`` in the session
    (both 1-based, equal to ``CURRENT_ROUND_STEP``/``SESSION_STEP`` after the
    step). ``commands``/``results`` are the JSON forms of
    :class:`~saucer.dispatch.messages.Command`/``Result``. ``cost`` is None
    when unknown. ``timings`` holds ``handle_ms``, ``commit_ms`` and ``total_ms``.
    """

    session_id: str
    round: int
    step: int
    session_step: int
    agent: str
    state: str
    status: str = ""
    next_agent: str | None = None
    next_state: str | None = None
    subtask: str = ""
    subtask_index: int = 0
    plan_index: int | None = None
    commands: list[dict[str, Any]] = field(default_factory=_no_items)
    results: list[dict[str, Any]] = field(default_factory=_no_items)
    cost: float | None = 0.0
    error: str | None = None
    started_at: float = 0.0
    timings: dict[str, float] = field(default_factory=_no_entries)
    version: int | None = None
    extra: dict[str, Any] = field(default_factory=_no_entries)
    #: What was saved of the desktop before the step (``system.save_ui_tree``, operator modes): one dict per
    #: file, ``kind`` (``ui_tree`` or ``screenshot``) and ``path``, or ``error`` when it could not be taken.
    artifacts: list[dict[str, Any]] = field(default_factory=_no_items)

    def to_dict(self) -> dict[str, Any]:
        """The record as a plain dict (no copies of nested values), tagged with its step format."""
        data = {name: getattr(self, name) for name in _STEP_FIELDS}
        data[STEP_FORMAT_KEY] = STEP_FORMAT
        return data

    def to_meta(self) -> StepRecordMeta:
        """The compact form stored in the step's event ``meta``: fields at their defaults are left out.

        ``session_id``, ``version`` and ``timings`` are not known or not needed
        there; :meth:`from_dict` restores the defaults.
        """
        meta: StepRecordMeta = {
            STEP_FORMAT_KEY: STEP_FORMAT,
            "round": self.round,
            "step": self.step,
            "session_step": self.session_step,
            "agent": self.agent,
            "state": self.state,
            "status": self.status,
            "next_agent": self.next_agent,
            "next_state": self.next_state,
            "subtask_index": self.subtask_index,
            "started_at": self.started_at,
        }
        if self.subtask:
            meta["subtask"] = self.subtask
        if self.plan_index is not None:
            meta["plan_index"] = self.plan_index
        if self.commands:
            meta["commands"] = self.commands
            meta["results"] = self.results
        if self.cost != 0.0:
            meta["cost"] = self.cost
        if self.error is not None:
            meta["error"] = self.error
        if self.extra:
            meta["extra"] = self.extra
        if self.artifacts:
            meta["artifacts"] = self.artifacts
        return meta

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], session_id: str = "") -> StepRecord:
        """Validate a stored dict (a log line, or an event's ``meta`` plus its ``session_id``) into a record.

        Any step format up to :data:`~saucer.engine.step_format.STEP_FORMAT` is
        read (older ones upcast); a newer one is a
        :class:`~saucer.engine.step_format.StepFormatError` naming both versions.
        """
        fields_ = {k: v for k, v in upcast_step(data).items() if k in _STEP_FIELD_SET}
        fields_.setdefault("session_id", session_id)
        return _step_adapter().validate_python(fields_)


_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))
_STEP_FIELD_SET = frozenset(_STEP_FIELDS)


@functools.cache
def _step_adapter() -> TypeAdapter[StepRecord]:
    return TypeAdapter(StepRecord)  # built when a record is first read back, not at import


class RequestLogEntry(BaseModel):
    """One model call, as LLM agents log it to ``request.log`` (never an API key)."""

    model_config = ConfigDict(extra="allow", defer_build=True)

    round: int | None = None
    step: int | None = None
    agent: str = ""
    model: str = ""
    prompt: Any = None
    response: Any = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    latency_ms: float | None = None
    error: str | None = None
    timestamp: float = 0.0


class EvaluationLogEntry(BaseModel):
    """One evaluation's verdict, as written to ``evaluation.log``."""

    model_config = ConfigDict(extra="forbid")

    scope: str
    round: int | None = None
    evaluator: str = ""
    complete: str = "unsure"
    reason: str = ""
    sub_scores: dict[str, Any] = {}
    cost: float | None = 0.0
    timestamp: float = 0.0


def read_step_log(path: str | Path) -> Iterator[StepRecord]:
    """The records of a ``response.log`` (or of the folder holding one), in order.

    Lines of every older step format are upcast; a malformed line is a
    ``ValueError`` and a newer format a :class:`~saucer.engine.step_format.StepFormatError`,
    both naming the file and line.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESPONSE_LOG
    with path.open("rb") as fh:
        yield from _step_records(fh, path)


def _step_records(lines: Iterable[bytes], path: Path) -> Iterator[StepRecord]:
    """The records of ``response.log`` lines (errors name ``path`` and the line)."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            record = _step_adapter().validate_python(upcast_step(data, "this record"))
        except StepFormatError as exc:
            raise StepFormatError(f"{path}:{number}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a step record ({exc})") from None
        yield record


def _read_models(path: Path, name: str, model: type[BaseModel]) -> Iterator[Any]:
    if path.is_dir():
        path = path / name
    if not path.exists():
        return
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                yield model.model_validate_json(line)


def read_request_log(path: str | Path) -> Iterator[RequestLogEntry]:
    """The entries of a ``request.log`` (or of the folder holding one)."""
    return _read_models(Path(path), REQUEST_LOG, RequestLogEntry)


def read_evaluation_log(path: str | Path) -> Iterator[EvaluationLogEntry]:
    """The entries of an ``evaluation.log`` (or of the folder holding one)."""
    return _read_models(Path(path), EVALUATION_LOG, EvaluationLogEntry)


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def new_session_id(task: str) -> str:
    """``<task>-<YYYYmmdd-HHMMSS>-<10 hex>``: readable, sortable, unique (40 random bits:
    a million sessions started in the same second collide with odds of about 1 in 2 million)."""
    return f"{slug(task, 40)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:10]}"


def slug(text: str, limit: int = 60) -> str:
    """A file-name-safe version of ``text`` (never empty, never ``.`` or ``..``)."""
    out = _SLUG.sub("_", text.strip()).strip("._")[:limit]
    return out or "task"


def log_dir_for(root: str | Path, task: str, session_id: str) -> Path:
    """``root/<task>/<session_id>`` (names made file-system safe)."""
    return Path(*_log_dir_names(root, task, session_id))


def _log_dir_names(root: str | Path, task: str, session_id: str) -> tuple[str, str]:
    """:func:`log_dir_for`'s folder as strings: its parent and its name (a Path costs more to build
    than the system calls :meth:`SessionLogs.create` makes)."""
    return os.path.join(root, slug(task)), slug(session_id, 120)


class _LineHandler(logging.Handler):
    """Writes each record's message as one line to a lazily opened file."""

    def __init__(self, logs: SessionLogs, name: str) -> None:
        super().__init__()
        self._logs = logs
        self._name = name

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if self._name == TEXT_LOG:
                msg = f"{record.levelname} {msg}"
            self._logs.write_line(self._name, msg)
        except Exception:  # noqa: BLE001 - logging must never break a session
            self.handleError(record)


class SessionLogs:
    """The files of one session; handles open on first write and stay open until :meth:`close`."""

    def __init__(self, path: Path | None, *, fresh: bool = False) -> None:
        self.path = path
        self._files: dict[str, int] = {}  # name -> open descriptor
        self._loggers: dict[str, logging.Logger] = {}
        #: The lines written to ``response.log``, when this object made the folder and so wrote the
        #: whole file (None: the file is read back, e.g. a resumed run's).
        self._steps: list[bytes] | None = [] if fresh and path is not None else None

    @classmethod
    def create(cls, root: str | Path, task: str, session_id: str) -> SessionLogs:
        """A fresh folder for a new session (suffixed if a previous run used the name)."""
        parent, base = _log_dir_names(root, task, session_id)
        name = base
        n = 1
        made_parents = False
        while True:  # mkdir is the test of the name: one system call when it is free
            try:
                os.mkdir(os.path.join(parent, name))
                break
            except FileExistsError:  # (a file, a folder or a link: taken either way)
                n += 1
                name = f"{base}-{n}"
            except FileNotFoundError:
                if made_parents:
                    raise
                os.makedirs(parent, exist_ok=True)  # the task's folder, once for its first session
                made_parents = True
        # What Path.resolve() names (the new folder itself is no link): its parent resolved, then its name.
        return cls(Path(os.path.join(os.path.realpath(parent), name)), fresh=True)

    @classmethod
    def reopen(cls, path: str | Path) -> SessionLogs:
        """The folder of a session being resumed (its files are appended to)."""
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        return cls(p)

    @classmethod
    def disabled(cls) -> SessionLogs:
        """Logs that write nothing."""
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _file(self, name: str) -> int | None:
        fd = self._files.get(name)
        if fd is None:
            if self.path is None:
                return None
            fd = self._files[name] = os.open(os.path.join(self.path, name), _APPEND, 0o666)
        return fd

    def write_line(self, name: str, text: str | bytes) -> bytes | None:
        """Append one line to ``name`` (secrets redacted); return it as written (None: logs are off)."""
        fd = self._files.get(name)
        if fd is None:
            fd = self._file(name)
            if fd is None:
                return None
        text = redact_text(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)
        data = text.encode("utf-8")
        _write_all(fd, data + b"\n")
        return data

    def write_step(self, record: StepRecord | dict[str, Any]) -> None:
        """One line of ``response.log``."""
        if self.path is None:
            return
        data = record.to_dict() if isinstance(record, StepRecord) else record
        line = self.write_line(RESPONSE_LOG, dumps(redact(data)))
        if self._steps is not None and line is not None:
            self._steps.append(line)

    def step_records(self) -> list[StepRecord]:
        """The records of ``response.log``, in order: its lines as this run wrote them when it made the
        folder (not read back), else read from the file (:func:`read_step_log`; [] when there is none)."""
        if self.path is None:
            return []
        if self._steps is not None:
            return list(_step_records(self._steps, self.path / RESPONSE_LOG))
        if not (self.path / RESPONSE_LOG).exists():
            return []
        return list(read_step_log(self.path))

    def write_request(self, entry: RequestLogEntry | dict[str, Any]) -> None:
        """One line of ``request.log``."""
        if self.path is None:
            return
        model = entry if isinstance(entry, RequestLogEntry) else RequestLogEntry.model_validate(entry)
        self.write_line(REQUEST_LOG, model.model_dump_json())

    def write_evaluation(self, entry: EvaluationLogEntry | dict[str, Any]) -> None:
        """One line of ``evaluation.log``."""
        if self.path is None:
            return
        model = entry if isinstance(entry, EvaluationLogEntry) else EvaluationLogEntry.model_validate(entry)
        self.write_line(EVALUATION_LOG, model.model_dump_json())

    def logger(self, name: str) -> logging.Logger:
        """A logger writing each message as a line of ``name`` (not registered globally)."""
        logger = self._loggers.get(name)
        if logger is None:
            # logging.Logger() directly: getLogger() would keep every session's logger forever.
            logger = logging.Logger(f"saucer.session.{name}", level=logging.DEBUG)
            logger.propagate = False
            if self.path is not None:
                logger.addHandler(_LineHandler(self, name))
            else:
                logger.addHandler(logging.NullHandler())
            self._loggers[name] = logger
        return logger

    def write_markdown(self, text: str) -> None:
        """Write ``output.md`` (replacing an older one: it is rendered from the whole log)."""
        if self.path is not None:
            fd = os.open(os.path.join(self.path, MARKDOWN_LOG), _REPLACE, 0o666)
            try:
                _write_all(fd, redact_text(text).encode("utf-8"))
            finally:
                os.close(fd)

    def close(self) -> None:
        """Close every open file. Idempotent."""
        for fd in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files.clear()
        for logger in self._loggers.values():
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
        self._loggers.clear()


def render_markdown(title: str, records: list[StepRecord], summary: dict[str, Any]) -> str:
    """A readable ``output.md``: the steps of each round, then the summary."""
    lines = [f"# {title}", ""]
    current = None
    for rec in records:
        if rec.round != current:
            current = rec.round
            lines += ["", f"## Round {rec.round}", ""]
        head = f"- **step {rec.step}** `{rec.agent}` [{rec.state} → {rec.status}]"
        if rec.subtask:
            head += f" {rec.subtask}"
        if rec.cost:
            head += f" (cost {rec.cost:.4f})"
        lines.append(head)
        for art in rec.artifacts:
            what = "UI tree" if art.get("kind") == "ui_tree" else str(art.get("kind", "artifact"))
            when = "after" if art.get("after") else "before"
            if art.get("error"):
                lines.append(f"  - {what} {when} the step: not saved ({str(art['error'])[:200]})")
            elif art.get("path") and art.get("kind") == "screenshot":
                lines.append(f"  - {what} {when} the step: ![{what} {when} step {rec.session_step}](<{art['path']}>)")
            elif art.get("path"):
                lines.append(f"  - {what} {when} the step: [{art.get('nodes', '?')} elements](<{art['path']}>)")
        for i, cmd in enumerate(rec.commands):
            res = rec.results[i] if i < len(rec.results) else {}
            status = res.get("status", "-")
            detail = res.get("error") or res.get("result")
            shown = detail if isinstance(detail, str) else dumps(detail).decode()
            text = "" if detail in (None, "") else f" → {shown[:200]}"
            params = dumps(cmd.get("parameters", {})).decode()[:200]
            lines.append(f"  - `{cmd.get('tool_name')}` {params}: **{status}**{text}")
        if rec.error:
            lines.append(f"  - error: {rec.error}")
    lines += ["", "## Summary", ""]
    for key, value in summary.items():
        lines.append(f"- {key}: {value}")
    lines.append("")
    return "\n".join(lines)
