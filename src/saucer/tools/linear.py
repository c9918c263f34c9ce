"""Regular expressions from a model, a plan or a user's rule, matched in linear time.

Python's :mod:`re` backtracks: ``(a+)+$`` against 25 ``a`` and a ``!`` takes
seconds, holding the GIL, so a search run in a worker thread still freezes
the host's event loop (in-process tools are the default). Every pattern that
comes from outside saucer's own code -- ``files.search`` with ``regex=true``,
the ``re:`` command rules, the desktop tool's ``re:`` selectors -- is
compiled here with RE2 (``google-re2``), whose matching time is linear in
the text whatever the pattern. RE2 refuses what cannot be matched that way
(backreferences, look-around); such a pattern is a :class:`ValueError`
saying so, never a silent fallback to :mod:`re`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import re2  # google-re2 ships no type information: an override in pyproject.toml

__all__ = ["LinearPattern", "compile_linear", "MAX_PROGRAM_BYTES"]

#: Memory one compiled pattern may take (RE2's budget; a larger pattern is refused).
MAX_PROGRAM_BYTES = 8 << 20

_UNSUPPORTED = ("invalid perl operator", "invalid escape sequence", "invalid named capture group")


@dataclass(frozen=True)
class LinearPattern:
    """A compiled pattern (``pattern`` as written) whose matching time is linear in the text."""

    pattern: str
    _compiled: Any

    def search(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text``."""
        return self._compiled.search(text) is not None


def compile_linear(pattern: str, *, ignore_case: bool = False, literal: bool = False) -> LinearPattern:
    """``pattern`` compiled with RE2; a :class:`ValueError` of one sentence when it is not valid
    or uses what linear-time matching cannot do (backreferences, look-ahead or look-behind).
    ``literal``: ``pattern`` is plain text, found as it is."""
    options = re2.Options()
    options.log_errors = False  # the reason goes into the error, not to stderr
    options.case_sensitive = not ignore_case
    options.max_mem = MAX_PROGRAM_BYTES
    options.literal = literal
    try:
        return LinearPattern(pattern, re2.compile(pattern, options))
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if reason.startswith(_UNSUPPORTED):
            reason += " (backreferences and look-around are not supported: patterns are matched in linear time, by RE2)"
        elif "too large" in reason or "out of memory" in reason:
            reason = f"pattern too large (compiled, it needs more than {MAX_PROGRAM_BYTES >> 20} MiB)"
        raise ValueError(reason) from None
