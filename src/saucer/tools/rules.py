"""Command-line rules: allow/deny lists for the shell server, sensitivity for the dispatcher.

A rule is a glob (``rm *``, matched with :func:`fnmatch.fnmatchcase`) or, with
the prefix ``re:``, a regular expression searched in the text
(``re:^\\s*sudo\\b``). A command line is checked as a whole *and* segment by
segment, the segments being what the shell may run separately (split on ``;``,
``&&``, ``||``, ``|``, ``&``, newlines, parentheses and backticks), so
``cd /tmp && rm -rf x`` and ``echo $(rm -rf x)`` match ``rm *``.

These rules are a guard against mistakes and a trigger for asking the user,
not a security boundary: a shell can always hide a command (``eval``,
variables, scripts). The sandbox that holds is the files server's root.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CommandRule",
    "SensitivityRules",
    "DEFAULT_SENSITIVE_COMMANDS",
    "compile_rules",
    "split_command_line",
    "first_matching_rule",
    "refusal_reason",
    "sensitive_reason",
    "is_sensitive",
]

REGEX_PREFIX = "re:"

#: Shell command patterns the default configuration asks the user about.
DEFAULT_SENSITIVE_COMMANDS: tuple[str, ...] = (
    "rm *",
    "rmdir *",
    "sudo *",
    "su *",
    "dd *",
    "mkfs*",
    "shred *",
    "chmod -R *",
    "chown *",
    "kill *",
    "pkill *",
    "killall *",
    "shutdown*",
    "reboot*",
    "git push*",
    "git reset --hard*",
    "git clean *",
    "re:(^|\\s)>\\s*/dev/sd",
)

# Operators after which the shell starts a new command; parentheses and
# backticks start a subshell or a command substitution. Splitting also inside
# quotes errs on the safe side: deny and sensitive rules match more often and
# allow rules (which must match every segment) refuse more often.
_SEPARATORS = re.compile(r"\|\||&&|;|\||&|\n|\(|\)|`")


@dataclass(frozen=True)
class CommandRule:
    """One compiled glob or ``re:`` pattern; ``pattern`` is the text as configured."""

    pattern: str
    # Rules are shown as written (not repr'd) so a regex's backslashes read as configured.
    _regex: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def compile(cls, pattern: str) -> "CommandRule":
        """Compile ``pattern``; a bad regular expression is a ValueError naming it."""
        if not isinstance(pattern, str) or not pattern.strip():
            raise ValueError(f"a command rule must be a non-empty string, got {pattern!r}")
        if pattern.startswith(REGEX_PREFIX):
            try:
                return cls(pattern, re.compile(pattern[len(REGEX_PREFIX) :]))
            except re.error as exc:
                raise ValueError(f"invalid regular expression in rule '{pattern}': {exc}") from exc
        return cls(pattern)

    def matches(self, text: str) -> bool:
        """Whether this rule matches ``text`` (one command line or one segment of it)."""
        if self._regex is not None:
            return self._regex.search(text) is not None
        return fnmatch.fnmatchcase(text, self.pattern)


def compile_rules(patterns: Iterable[str | CommandRule]) -> tuple[CommandRule, ...]:
    """Compile several patterns, keeping already compiled rules as they are."""
    return tuple(p if isinstance(p, CommandRule) else CommandRule.compile(p) for p in patterns)


def split_command_line(command_line: str) -> list[str]:
    """The separately run commands of ``command_line``, stripped, empty ones dropped."""
    return [part.strip() for part in _SEPARATORS.split(command_line) if part.strip()]


def first_matching_rule(command_line: str, rules: Iterable[CommandRule]) -> CommandRule | None:
    """The first rule matching the whole line or any of its segments, or None."""
    candidates = [command_line.strip(), *split_command_line(command_line)]
    for rule in rules:
        if any(rule.matches(text) for text in candidates):
            return rule
    return None


def refusal_reason(
    command_line: str, allow: Iterable[CommandRule] = (), deny: Iterable[CommandRule] = ()
) -> str | None:
    """Why the shell must not run ``command_line``, or None when it may.

    A deny rule matching the line or any segment refuses it. When allow rules
    exist, *every* segment must match one of them, so ``ls; rm x`` is not
    let through by ``ls *``.
    """
    deny_rules = tuple(deny)
    allow_rules = tuple(allow)
    denied = first_matching_rule(command_line, deny_rules)
    if denied is not None:
        return f"command refused by deny rule '{denied.pattern}'"
    if allow_rules:
        segments = split_command_line(command_line) or [command_line.strip()]
        for segment in segments:
            if not any(rule.matches(segment) for rule in allow_rules):
                allowed = ", ".join(f"'{r.pattern}'" for r in allow_rules)
                return f"command {segment!r} matches no allow rule (allowed: {allowed})"
    return None


@dataclass(frozen=True)
class SensitivityRules:
    """What the dispatcher asks the user about before running.

    ``tools`` holds qualified names (``server.tool``); ``command_patterns``
    are matched against a string ``command`` parameter (the shell's ``run``)
    of the tools listed in ``command_tools`` (all tools when it is empty).
    """

    tools: frozenset[str] = frozenset()
    command_patterns: tuple[CommandRule, ...] = ()
    command_tools: frozenset[str] = frozenset()
    command_parameter: str = "command"

    @classmethod
    def build(
        cls,
        tools: Iterable[str] = (),
        command_patterns: Iterable[str | CommandRule] = (),
        command_tools: Iterable[str] = (),
        command_parameter: str = "command",
    ) -> "SensitivityRules":
        """Rules from plain lists (patterns are compiled here)."""
        return cls(frozenset(tools), compile_rules(command_patterns), frozenset(command_tools), command_parameter)

    def merged(self, other: "SensitivityRules") -> "SensitivityRules":
        """Both rule sets at once."""
        return SensitivityRules(
            self.tools | other.tools,
            self.command_patterns + other.command_patterns,
            self.command_tools | other.command_tools,
            self.command_parameter,
        )


def sensitive_reason(tool_name: str, parameters: Mapping[str, Any], rules: SensitivityRules) -> str | None:
    """Why the call ``tool_name(**parameters)`` needs approval, or None when it does not."""
    if tool_name in rules.tools:
        return f"tool {tool_name!r} is marked sensitive"
    if rules.command_patterns and (not rules.command_tools or tool_name in rules.command_tools):
        command_line = parameters.get(rules.command_parameter)
        if isinstance(command_line, str):
            rule = first_matching_rule(command_line, rules.command_patterns)
            if rule is not None:
                return f"command {command_line!r} matches sensitive pattern '{rule.pattern}'"
    return None


def is_sensitive(tool_name: str, parameters: Mapping[str, Any], rules: SensitivityRules) -> bool:
    """Whether the call ``tool_name(**parameters)`` needs approval (see :func:`sensitive_reason`)."""
    return sensitive_reason(tool_name, parameters, rules) is not None
