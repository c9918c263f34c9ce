"""The seed's defaults a session cannot apply, and why: said once, kept in the session's record.

The seed (UFO's configuration table) turns on ``system.save_ui_tree``,
``system.log_to_markdown`` and ``system.save_experience = "ask"`` by default.
Where one cannot apply -- no desktop to read a UI tree from, logs turned
off, no one to ask -- the session runs without it: :func:`inapplicable`
says which and why, the run says so once on stderr (one warning line per
distinct reason, however many sessions share it), and the session's start
and end events carry the same ``skipped`` mapping (setting -> reason), as
does its :class:`~saucer.engine.result.SessionResult`.

``system.eva_session`` needs no model: without one the rule evaluator
(``agents.evaluator``) judges from the command results, so it always applies.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from saucer.config import SettingsModel
from saucer.engine.interactor import UserChannel
from saucer.engine.uitree import UI_TREE_TOOL

__all__ = ["inapplicable", "can_answer", "say_once", "NO_DESKTOP", "NO_TERMINAL", "LOGS_OFF"]

_log = logging.getLogger("saucer.engine")

NO_DESKTOP = (
    f"no desktop to read: the session's tools have no {UI_TREE_TOOL} (the built-in desktop server starts only "
    "with an X display: DISPLAY or [desktop] display)"
)
NO_TERMINAL = "no terminal to ask, so nothing is saved (--yes saves, or set system.save_experience)"
LOGS_OFF = "logs are off (logs.enabled = false): there is no log folder to write output.md to"


def can_answer(channel: UserChannel) -> bool:
    """Whether the interactor answers a question: someone at a terminal, or ``assume_yes`` (--yes)."""
    if not channel.present:
        return False
    return channel.interactive(True) or channel.assume_yes


def inapplicable(settings: SettingsModel, *, tools: Mapping[str, Any], logs_on: bool) -> dict[str, str]:
    """The settings (``save_ui_tree``, ``log_to_markdown``) that are on but cannot apply to a session
    with these ``tools`` and logs -> why. (``save_experience = "ask"`` with no one to ask is known when
    the session ends: :func:`saucer.engine.experience.wanted` says :data:`NO_TERMINAL`.)"""
    system = settings.system
    out: dict[str, str] = {}
    if system.save_ui_tree and UI_TREE_TOOL not in tools:
        out["save_ui_tree"] = NO_DESKTOP
    if system.log_to_markdown and not logs_on:
        out["log_to_markdown"] = LOGS_OFF
    return out


_SAID: set[str] = set()


def say_once(skipped: Mapping[str, str]) -> None:
    """One warning line per skipped setting and reason, the first time this process meets it."""
    for setting, reason in skipped.items():
        line = f"system.{setting} is on but skipped: {reason}"
        if line not in _SAID:
            _SAID.add(line)
            _log.warning("%s", line)
