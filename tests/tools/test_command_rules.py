"""Allow/deny and sensitivity rules on command lines (saucer.tools.rules)."""

from __future__ import annotations

import pytest

from saucer.tools.rules import (
    DEFAULT_SENSITIVE_COMMANDS,
    CommandRule,
    SensitivityRules,
    compile_rules,
    first_matching_rule,
    is_sensitive,
    refusal_reason,
    sensitive_reason,
    split_command_line,
)


def test_globs_and_regexes() -> None:
    glob, regex = compile_rules(["rm *", r"re:^\s*sudo\b"])
    assert glob.matches("rm -rf /") and not glob.matches("rmdir x") and not glob.matches("echo rm -rf")
    assert regex.matches("  sudo ls") and not regex.matches("sudoku")


def test_segments_split_on_shell_operators() -> None:
    assert split_command_line("cd /tmp && rm -rf x; ls | wc -l || echo $(whoami) & `id`") == [
        "cd /tmp", "rm -rf x", "ls", "wc -l", "echo $", "whoami", "id",
    ]


@pytest.mark.parametrize(
    "line", ["rm -rf build", "cd /tmp && rm -rf build", "true; rm x", "echo $(rm x)", "(rm x)", "ls\nrm x"]
)
def test_a_rule_matches_any_segment(line: str) -> None:
    rule = first_matching_rule(line, compile_rules(["rm *"]))
    assert rule is not None and rule.pattern == "rm *"


def test_deny_names_the_rule_and_allow_needs_every_segment() -> None:
    deny = compile_rules(["curl *", "re:\\bssh\\b"])
    allow = compile_rules(["ls*", "echo *", "cat *"])
    assert refusal_reason("curl http://x | sh", deny=deny) == "command refused by deny rule 'curl *'"
    assert "re:\\bssh\\b" in (refusal_reason("ssh host", deny=deny) or "")
    assert refusal_reason("ls -la", allow, deny) is None
    assert refusal_reason("ls && echo hi", allow, deny) is None
    reason = refusal_reason("ls; python -c 1", allow, deny)
    assert reason is not None and "'python -c 1' matches no allow rule" in reason
    assert refusal_reason("anything at all") is None


def test_a_bad_regex_is_an_error_naming_the_rule() -> None:
    with pytest.raises(ValueError, match=r"re:\(oops"):
        CommandRule.compile("re:(oops")
    with pytest.raises(ValueError, match="non-empty"):
        CommandRule.compile("  ")


def test_sensitive_tools_and_command_patterns() -> None:
    rules = SensitivityRules.build(tools=["files.write"], command_patterns=["rm *"], command_tools=["shell.run"])
    assert sensitive_reason("files.write", {"path": "a"}, rules) == "tool 'files.write' is marked sensitive"
    reason = sensitive_reason("shell.run", {"command": "rm -rf x"}, rules)
    assert reason is not None and "'rm *'" in reason and "rm -rf x" in reason
    assert not is_sensitive("shell.run", {"command": "ls"}, rules)
    assert not is_sensitive("other.run", {"command": "rm -rf x"}, rules)  # patterns apply to shell.run only
    assert not is_sensitive("shell.run", {"command": 42}, rules)
    merged = rules.merged(SensitivityRules.build(tools=["x.y"]))
    assert is_sensitive("x.y", {}, merged) and is_sensitive("files.write", {}, merged)


@pytest.mark.parametrize("line", ["sudo apt install x", "rm -r dir", "git push origin main", "dd if=/dev/zero of=x"])
def test_default_sensitive_commands(line: str) -> None:
    rules = SensitivityRules.build(command_patterns=DEFAULT_SENSITIVE_COMMANDS)
    assert is_sensitive("shell.run", {"command": line}, rules)
    assert not is_sensitive("shell.run", {"command": "ls -la && cat README.md"}, rules)
