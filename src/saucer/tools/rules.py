"""Command-line rules: allow/deny lists for the shell server, sensitivity for the dispatcher.

A rule is a glob (``rm *``, matched with :func:`fnmatch.fnmatchcase`) or, with
the prefix ``re:``, a regular expression searched in the text
(``re:^\\s*sudo\\b``). Rules are matched against each program the command
line runs, found by *parsing* it (:mod:`saucer.tools.shellparse`): every
simple command in every list, pipeline, ``if``/``for``/``while``/``case``,
group, subshell, function and command substitution, with quoting and
assignments resolved, wrappers (``env``, ``sudo``, ``xargs``, ``exec``...)
unwrapped and ``sh -c``/``eval`` strings parsed in turn. A program is shown
to a rule as its words joined by spaces, with redirections after them
(``rm -rf build``, ``echo x > /dev/sda``), and once more with its name
reduced to the base name (``/bin/rm x`` is also ``rm x``).

A line that cannot be checked (it does not parse, a command name is only
known at run time, a shell reads commands from standard input) is treated as
sensitive, and refused when allow or deny rules exist.

These rules are a guard against mistakes and a trigger for asking the user,
a courtesy, not a security boundary: a script, an interpreter (``python -c``)
or a program that deletes files itself is not looked into. The boundary that
holds is the kernel's: commands run confined (:mod:`saucer.tools.confine`),
able to write only to the workspace, the artifacts and a private TMPDIR.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saucer.tools.linear import LinearPattern, compile_linear

if TYPE_CHECKING:
    from saucer.tools.shellparse import CommandLine, Invocation

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
    "mke2fs*",
    "wipefs *",
    "shred *",
    "unlink *",
    "truncate *",
    "chmod -R *",
    # Recursion in any spelling and place: -R, -fR, -Rv, --recursive, "000 -R dir".
    "re:^chmod\\s(.*\\s)?(-[A-Za-z]*R[A-Za-z]*|--recursive)(\\s|$)",
    "chown *",
    "chgrp *",
    "kill *",
    "pkill *",
    "killall *",
    "shutdown*",
    "reboot*",
    "git push*",
    "git reset --hard*",
    "git clean *",
    "find *-delete*",
    "re:(^|\\s)>\\s*/dev/sd",
)


@dataclass(frozen=True)
class CommandRule:
    """One compiled glob or ``re:`` pattern; ``pattern`` is the text as configured."""

    pattern: str
    # Rules are shown as written (not repr'd) so a regex's backslashes read as configured.
    _regex: LinearPattern | None = field(default=None, repr=False, compare=False)

    @classmethod
    def compile(cls, pattern: str) -> CommandRule:
        """Compile ``pattern``; a bad regular expression is a ValueError naming it."""
        if not isinstance(pattern, str) or not pattern.strip():
            raise ValueError(f"a command rule must be a non-empty string, got {pattern!r}")
        if pattern.startswith(REGEX_PREFIX):
            try:  # in linear time: a plan's command text must not freeze the host on a user's rule
                return cls(pattern, compile_linear(pattern[len(REGEX_PREFIX) :]))
            except ValueError as exc:
                raise ValueError(f"invalid regular expression in rule '{pattern}': {exc}") from None
        return cls(pattern)

    def matches(self, text: str) -> bool:
        """Whether this rule matches ``text`` (one command line or one segment of it)."""
        if self._regex is not None:
            return self._regex.search(text)
        return fnmatch.fnmatchcase(text, self.pattern)


def compile_rules(patterns: Iterable[str | CommandRule]) -> tuple[CommandRule, ...]:
    """Compile several patterns, keeping already compiled rules as they are."""
    return tuple(p if isinstance(p, CommandRule) else CommandRule.compile(p) for p in patterns)


def _analyse(command_line: str) -> CommandLine:
    # The parser (tree-sitter's bash grammar) is loaded by the first command line checked, not by
    # every process that builds rules: a session whose tools take no command line never needs it.
    from saucer.tools.shellparse import analyse

    return analyse(command_line)


def split_command_line(command_line: str) -> list[str]:
    """The programs ``command_line`` runs, as the text rules are matched against (see the module docs)."""
    return [invocation.text for invocation in _analyse(command_line).invocations]


def _matching(rules: Iterable[CommandRule], invocations: Iterable[Invocation]) -> tuple[CommandRule, Invocation] | None:
    candidates = list(invocations)
    for rule in rules:
        for invocation in candidates:
            if rule.matches(invocation.text) or rule.matches(invocation.short):
                return rule, invocation
    return None


def _deniable(parsed: CommandLine) -> list[Invocation]:
    # Deny and sensitive rules also look at what a wrapper *might* run.
    return [*parsed.invocations, *parsed.possible]


def first_matching_rule(command_line: str, rules: Iterable[CommandRule]) -> CommandRule | None:
    """The first rule matching any program ``command_line`` runs (or may run, behind a wrapper), or None."""
    found = _matching(rules, _deniable(_analyse(command_line)))
    return found[0] if found is not None else None


def refusal_reason(
    command_line: str, allow: Iterable[CommandRule] = (), deny: Iterable[CommandRule] = ()
) -> str | None:
    """Why the shell must not run ``command_line``, or None when it may.

    A deny rule matching any program the line runs refuses it. When allow
    rules exist, *every* program it runs must match one of them, so
    ``ls; rm x`` is not let through by ``ls *``. With either kind of rule, a
    line that cannot be checked is refused.
    """
    deny_rules = tuple(deny)
    allow_rules = tuple(allow)
    if not deny_rules and not allow_rules:
        return None
    parsed = _analyse(command_line)
    if parsed.unknown:
        kind = "allow and deny" if deny_rules and allow_rules else "allow" if allow_rules else "deny"
        return f"command refused: it cannot be checked against the {kind} rules ({parsed.unknown[0]})"
    denied = _matching(deny_rules, _deniable(parsed))
    if denied is not None:
        return f"command refused by deny rule '{denied[0].pattern}'"
    for invocation in parsed.invocations if allow_rules else ():
        if _matching(allow_rules, [invocation]) is None:
            allowed = ", ".join(f"'{r.pattern}'" for r in allow_rules)
            return f"command {invocation.text!r} matches no allow rule (allowed: {allowed})"
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
    ) -> SensitivityRules:
        """Rules from plain lists (patterns are compiled here)."""
        return cls(frozenset(tools), compile_rules(command_patterns), frozenset(command_tools), command_parameter)

    def merged(self, other: SensitivityRules) -> SensitivityRules:
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
            parsed = _analyse(command_line)
            if parsed.unknown:
                return f"command {command_line!r} cannot be checked against the sensitive patterns: {parsed.unknown[0]}"
            found = _matching(rules.command_patterns, _deniable(parsed))
            if found is not None:
                rule, invocation = found
                runs = "" if invocation.text == command_line.strip() else f" (it runs {invocation.short!r})"
                return f"command {command_line!r} matches sensitive pattern '{rule.pattern}'{runs}"
    return None


def is_sensitive(tool_name: str, parameters: Mapping[str, Any], rules: SensitivityRules) -> bool:
    """Whether the call ``tool_name(**parameters)`` needs approval (see :func:`sensitive_reason`)."""
    return sensitive_reason(tool_name, parameters, rules) is not None
