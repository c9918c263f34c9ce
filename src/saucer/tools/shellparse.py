"""What a shell command line would run, found by parsing it (tree-sitter's bash grammar), not by pattern.

:func:`analyse` parses a command line and returns every *simple command* it
contains, wherever it sits: in lists and pipelines, ``if``/``for``/``while``/
``case`` bodies, ``{ }`` groups, subshells, function bodies, ``$( )`` and
backticks (inside strings and here-documents too), process substitutions.
Each one is then looked through:

- assignments (``A=1 rm x``), quoting and escapes (``"rm"``, ``'r'm``,
  ``r\\m``, ``$'rm'``) and absolute paths (``/bin/rm``) are resolved;
- wrappers that run their arguments as a command are unwrapped, each level
  kept: ``env``, ``command``, ``builtin``, ``exec``, ``nohup``, ``nice``,
  ``ionice``, ``time``, ``timeout``, ``sudo``, ``doas``, ``pkexec``,
  ``xargs``, ``setsid``, ``stdbuf``, ``runuser``, ``unshare``, ``setarch``,
  ``chrt``, ``setpriv``, ``prlimit``, ``nsenter``, ``busybox``, ``find -exec``...;
- strings run as shell code are parsed in turn: ``sh -c``/``bash -c`` (and
  the other shells), ``eval``, ``trap``, ``su -c``, ``runuser -c``,
  ``sg [-c]``, ``env -S``, ``watch``, alias definitions.

What cannot be known before the line runs is reported in
:attr:`CommandLine.unknown` instead of guessed: a line that does not parse, a
command name computed at run time (``$cmd x``, ``$(echo rm) x``, globs), a
shell reading its commands from standard input (``... | sh``), an ``eval``
of an expansion. Callers treat such a line as matching (sensitive, refused).

This is a guard-rail against mistakes, not a security boundary: a script
file, an interpreter (``python -c``), or a program that deletes files itself
are not looked into.
"""

from __future__ import annotations

import codecs
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

__all__ = ["Invocation", "CommandLine", "analyse", "MAX_COMMAND_LINE"]

MAX_COMMAND_LINE = 100_000
"""Longer command lines are not parsed; they count as unknown."""

_MAX_NESTING = 16
_MAX_POSSIBLE = 8

# Programs that run their remaining arguments as a command: name -> options that take a value.
_WRAPPERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string", "-a", "--argv0"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset({"-a"}),
    "nohup": frozenset(),
    "time": frozenset({"-f", "--format", "-o", "--output"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "--class", "-n", "--classdata", "-p", "--pid", "-P", "--pgid", "-u", "--uid"}),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
    "sudo": frozenset(
        {
            "-u",
            "--user",
            "-g",
            "--group",
            "-C",
            "--close-from",
            "-D",
            "--chdir",
            "-h",
            "--host",
            "-p",
            "--prompt",
            "-r",
            "--role",
            "-t",
            "--type",
            "-T",
            "--command-timeout",
            "-U",
            "--other-user",
            "-R",
            "--chroot",
        }
    ),
    "doas": frozenset({"-u", "-C"}),
    "setsid": frozenset(),
    "stdbuf": frozenset({"-i", "--input", "-o", "--output", "-e", "--error"}),
    "xargs": frozenset(
        {
            "-a",
            "--arg-file",
            "-d",
            "--delimiter",
            "-E",
            "-e",
            "--eof",
            "-I",
            "-i",
            "--replace",
            "-L",
            "-l",
            "--max-lines",
            "-n",
            "--max-args",
            "-P",
            "--max-procs",
            "-s",
            "--max-chars",
            "--process-slot-var",
        }
    ),
    "flock": frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}),
    "chroot": frozenset({"--userspec", "--groups"}),
    "taskset": frozenset(),
    "coproc": frozenset(),
    "unbuffer": frozenset(),
    "strace": frozenset({"-e", "-o", "-p", "-s", "-u", "-E", "-a", "-b", "-I", "-O", "-P", "-S", "-X"}),
    "ltrace": frozenset({"-e", "-o", "-p", "-s", "-u", "-a", "-n"}),
    "watch": frozenset({"-n", "--interval", "-d", "--differences", "-q", "--equexit"}),
    "script": frozenset(
        {
            "-c",
            "--command",
            "-E",
            "--echo",
            "-I",
            "--log-in",
            "-O",
            "--log-out",
            "-T",
            "--log-timing",
            "-m",
            "--logging-format",
        }
    ),
    # util-linux and friends: run the rest of the line as a command, changing one property of it.
    "runuser": frozenset(
        {"-u", "--user", "-g", "--group", "-G", "--supp-group", "-s", "--shell", "-w", "--whitelist-environment"}
    ),
    "unshare": frozenset(
        {
            "-S",
            "--setuid",
            "-G",
            "--setgid",
            "-R",
            "--root",
            "-w",
            "--wd",
            "--propagation",
            "--map-user",
            "--map-group",
            "--setgroups",
            "--map-users",
            "--map-groups",
        }
    ),
    "setarch": frozenset(),
    "linux32": frozenset(),
    "linux64": frozenset(),
    "chrt": frozenset({"-T", "--sched-runtime", "-P", "--sched-period", "-D", "--sched-deadline"}),
    "setpriv": frozenset(
        {
            "--reuid",
            "--regid",
            "--ruid",
            "--rgid",
            "--euid",
            "--egid",
            "--groups",
            "--inh-caps",
            "--ambient-caps",
            "--bounding-set",
            "--securebits",
            "--pdeathsig",
            "--selinux-label",
            "--apparmor-profile",
            "--landlock-access",
            "--landlock-rule",
        }
    ),
    "prlimit": frozenset({"-p", "--pid", "-o", "--output"}),
    "nsenter": frozenset({"-t", "--target", "-S", "--setuid", "-G", "--setgid"}),
    "pkexec": frozenset({"--user"}),
    "sg": frozenset(),
}
# Wrappers with one positional argument before the command (a duration, a directory, a file, a mask).
_ONE_POSITIONAL = frozenset({"timeout", "chroot", "flock", "taskset", "setarch", "chrt"})
# Shells: ``-c STRING`` runs STRING; no operand reads commands from standard input.
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "busybox"})
_SHELL_OPTIONS_WITH_VALUE = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_STDIN_SCRIPTS = re.compile(r"^(/dev/stdin|/dev/fd/\d+|/proc/(self|\d+)/fd/\d+|-)$")

_GLOB = re.compile(r"[*?\[{}]")


@dataclass(frozen=True)
class Invocation:
    """One program run by the line: its words as the shell would pass them, as far as they are known.

    ``words[0]`` is the command name as written (unquoted); ``text`` is the
    words joined by single spaces, then the redirections (``> /dev/sda``);
    ``short`` is the same with the name reduced to its last path component
    (``/bin/rm -f x`` -> ``rm -f x``). A word that is only known at run
    time keeps its source text (``$HOME``, ``$(ls)``).
    """

    words: tuple[str, ...]
    redirects: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The command name as written."""
        return self.words[0]

    @property
    def text(self) -> str:
        """Words and redirections, one space between each."""
        return " ".join((*self.words, *self.redirects))

    @property
    def short(self) -> str:
        """:attr:`text` with the command name reduced to its base name."""
        base = posixpath.basename(self.name) or self.name
        return " ".join((base, *self.words[1:], *self.redirects))


@dataclass(frozen=True)
class CommandLine:
    """What a command line runs.

    ``invocations`` are the programs it runs; ``possible`` are argument tails
    of wrappers that *could* be the command when an option takes a value this
    module does not know of (check them against deny and sensitive rules, not
    allow rules); ``unknown`` says why some of it cannot be known before it runs.
    """

    source: str
    invocations: tuple[Invocation, ...] = ()
    possible: tuple[Invocation, ...] = ()
    unknown: tuple[str, ...] = ()


@lru_cache(maxsize=1)
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bash.language()))


@lru_cache(maxsize=128)
def analyse(command_line: str) -> CommandLine:
    """Parse ``command_line`` and find every program it runs; see the module docs."""
    found = _Analyser()
    found.line(command_line, 0)
    return CommandLine(
        command_line,
        tuple(dict.fromkeys(found.invocations)),
        tuple(dict.fromkeys(found.possible)),
        tuple(dict.fromkeys(found.unknown)),
    )


class _Analyser:
    """Collects invocations and unknowns over one command line and the shell code nested in it."""

    def __init__(self) -> None:
        self.invocations: list[Invocation] = []
        self.possible: list[Invocation] = []
        self.unknown: list[str] = []

    def line(self, text: str, depth: int) -> None:
        if depth > _MAX_NESTING:
            self.unknown.append(f"commands nested more than {_MAX_NESTING} levels deep")
            return
        if len(text) > MAX_COMMAND_LINE:
            self.unknown.append(f"the command line is longer than {MAX_COMMAND_LINE} characters")
            return
        # A shell removes backslash-newline everywhere but in single quotes; the grammar does not,
        # so both readings are checked.
        variants = dict.fromkeys([text, text.replace("\\\n", "")])
        for variant in variants:
            tree = _parser().parse(variant.encode("utf-8", "surrogatepass"))
            if tree.root_node.has_error:
                self.unknown.append("it cannot be parsed as shell code")
                return
            for node in _commands(tree.root_node):
                self.command(node, depth)

    def command(self, node: Node, depth: int) -> None:
        name_node = node.child_by_field_name("name")
        if name_node is None:
            return  # only assignments or redirections
        name, static = _value(name_node)
        if not static or _GLOB.search(_raw_unquoted(name_node)):
            self.unknown.append(f"the command name {_text(name_node)!r} is only known when it runs")
            return
        words = [name]
        dynamic_args: set[int] = set()
        for argument in node.children_by_field_name("argument"):
            value, known = _value(argument)
            if not known:
                dynamic_args.add(len(words))
            words.append(value)
        self.invocation(words, dynamic_args, _redirects(node), depth)

    def invocation(self, words: list[str], dynamic: set[int], redirects: tuple[str, ...], depth: int) -> None:
        """Record ``words`` as run, then look inside it (wrappers, shells, eval)."""
        if depth > _MAX_NESTING:
            self.unknown.append(f"commands nested more than {_MAX_NESTING} levels deep")
            return
        self.invocations.append(Invocation(tuple(words), redirects))
        base = posixpath.basename(words[0])
        if base in _WRAPPERS:
            self.wrapper(base, words, dynamic, depth)
        elif base in _SHELLS:
            self.shell(words, dynamic, depth)
        elif base == "eval":
            self.code(words[1:], dynamic, 1, depth, "eval")
        elif base == "su":
            self.option_code(words, dynamic, ("-c", "--command"), depth)
        elif base == "trap":
            self.trap(words, dynamic, depth)
        elif base in (".", "source"):
            if len(words) < 2 or 1 in dynamic or _STDIN_SCRIPTS.match(words[1]):
                self.unknown.append(f"{base} reads a script that is only known when it runs")
        elif base == "alias":
            for index, word in enumerate(words[1:], start=1):
                _, eq, value = word.partition("=")
                if eq:  # the alias's words come before the arguments it is used with
                    self.code([value, "{}"], dynamic, index, depth, "an alias")
        elif base == "find":
            self.find(words, dynamic, depth)

    def rest(self, words: list[str], dynamic: set[int], start: int, depth: int, extra: tuple[str, ...] = ()) -> None:
        """``words[start:]`` is itself a command."""
        if start >= len(words):
            return
        if start in dynamic:
            self.unknown.append(f"the command name {words[start]!r} is only known when it runs")
            return
        shifted = {i - start for i in dynamic if i >= start}
        self.invocation([*words[start:], *extra], shifted, (), depth + 1)

    def code(self, parts: list[str], dynamic: set[int], offset: int, depth: int, what: str) -> None:
        """``parts`` (starting at word ``offset``) joined by spaces is shell code: analyse it."""
        if any(offset + i in dynamic for i in range(len(parts))):
            self.unknown.append(f"{what} runs code that is only known when it runs")
            return
        if parts:
            self.line(" ".join(parts), depth + 1)

    def option_code(self, words: list[str], dynamic: set[int], options: tuple[str, ...], depth: int) -> bool:
        """Analyse the value of the first of ``options`` (``-c STRING`` or ``--command=STRING``); True if found."""
        for index, word in enumerate(words[1:], start=1):
            for option in options:
                if word == option and index + 1 < len(words):
                    self.code([words[index + 1]], dynamic, index + 1, depth, words[0])
                    return True
                if option.startswith("--") and word.startswith(option + "="):
                    if index in dynamic:
                        self.unknown.append(f"{words[0]} runs code that is only known when it runs")
                    else:
                        self.line(word.split("=", 1)[1], depth + 1)
                    return True
        return False

    def wrapper(self, base: str, words: list[str], dynamic: set[int], depth: int) -> None:
        options = _WRAPPERS[base]
        if base == "command" and any(w in ("-v", "-V") for w in words[1:2]):
            return  # prints what a name is, runs nothing
        if base == "env" and self.option_code(words, dynamic, ("-S", "--split-string"), depth):
            return
        if base in ("script", "flock", "runuser") and self.option_code(words, dynamic, ("-c", "--command"), depth):
            return
        if base == "sg":  # sg GROUP [-c] COMMAND: the command is a string given to /bin/sh -c
            start = 2 if len(words) > 1 and words[1] != "-" else 3
            start += 1 if start < len(words) and words[start] == "-c" else 0
            self.code(words[start:], dynamic, start, depth, "sg")
            return
        index = 1
        while index < len(words) and index not in dynamic:
            word = words[index]
            if word == "--":
                index += 1
                break
            if base == "env" and "=" in word and not word.startswith("-"):
                index += 1  # NAME=VALUE
            elif word.startswith("-") and word != "-":
                index += 2 if word in options else 1  # "-u root", or a flag, "--opt=value", "-n5"
            else:
                break
        if base in _ONE_POSITIONAL:
            index += 1
        if base == "watch":
            self.code(words[index:], dynamic, index, depth, "watch")
            return
        if base == "xargs":
            self.rest(words, dynamic, index, depth, extra=("{}",))  # arguments come from standard input
            return
        self.rest(words, dynamic, index, depth)
        # Option arities of other versions may differ: every later position could be the command too.
        later = range(index + 1, min(len(words), index + 1 + _MAX_POSSIBLE))
        self.possible.extend(Invocation(tuple(words[i:])) for i in later if i not in dynamic)

    def trap(self, words: list[str], dynamic: set[int], depth: int) -> None:
        """``trap [--] ACTION SIGNAL...``: ACTION is shell code run later (on exit, on a signal)."""
        index = 1
        while index < len(words) and index not in dynamic and words[index].startswith("-") and words[index] != "-":
            if words[index] == "--":
                index += 1
                break
            if words[index] in ("-p", "-l", "-P"):
                return  # prints traps or signal names, sets none
            index += 1
        if index < len(words) and words[index] != "-":
            self.code(words[index : index + 1], dynamic, index, depth, "trap")

    def shell(self, words: list[str], dynamic: set[int], depth: int) -> None:
        index = 1
        command_string = False
        if posixpath.basename(words[0]) == "busybox":
            if len(words) < 2:
                return
            if posixpath.basename(words[1]) not in _SHELLS:
                self.rest(words, dynamic, 1, depth)
                return
            index = 2
        while index < len(words):
            word = words[index]
            if index in dynamic:
                break  # an option or the script: unknown either way (below)
            if word == "--":
                index += 1
                break
            if word in _SHELL_OPTIONS_WITH_VALUE:
                index += 2
                continue
            if word.startswith("--"):
                index += 1
                continue
            if word[:1] in "-+" and len(word) > 1:
                command_string = command_string or "c" in word[1:]
                if word.startswith("-") and "s" in word[1:]:
                    self.unknown.append(f"{words[0]} -s reads its commands from standard input")
                    return
                index += 2 if word[-1] in "oO" else 1  # "-euo pipefail"
                continue
            break
        if command_string:
            self.code(words[index : index + 1], dynamic, index, depth, f"{words[0]} -c")
            if index >= len(words):
                self.unknown.append(f"{words[0]} -c has no command string")
            return
        if index >= len(words):
            self.unknown.append(f"{words[0]} reads its commands from standard input")
        elif index in dynamic or _STDIN_SCRIPTS.match(words[index]):
            self.unknown.append(f"{words[0]} runs a script that is only known when it runs")

    def find(self, words: list[str], dynamic: set[int], depth: int) -> None:
        index = 1
        while index < len(words):
            if words[index] in ("-exec", "-execdir", "-ok", "-okdir"):
                end = index + 1
                while end < len(words) and words[end] not in (";", "+"):
                    end += 1
                self.rest(words[:end], dynamic, index + 1, depth)
                index = end
            index += 1


def _commands(root: Node) -> Iterator[Node]:
    """Every ``command`` node under ``root``, at any depth (strings, here-documents, substitutions...)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "command":
            yield node
        stack.extend(reversed(node.children))


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "surrogatepass")


def _raw_unquoted(node: Node) -> str:
    """The unquoted, unescaped parts of a word's source (where globbing and brace expansion apply)."""
    if node.type == "word":
        return re.sub(r"\\.", "", _text(node))
    if node.type in ("concatenation", "command_name"):
        return "".join(_raw_unquoted(child) for child in node.named_children)
    return ""


def _value(node: Node) -> tuple[str, bool]:
    """The word as the shell passes it, and whether that is known before running (else its source text)."""
    kind = node.type
    if kind == "command_name":
        children = node.named_children
        return _value(children[0]) if len(children) == 1 else (_text(node), False)
    if kind in ("word", "number"):
        return re.sub(r"\\(.)", r"\1", _text(node), flags=re.DOTALL), True
    if kind == "raw_string":
        return _text(node)[1:-1], True
    if kind == "ansi_c_string":
        decoded = _ansi_c(_text(node)[2:-1])
        return (decoded, True) if decoded is not None else (_text(node), False)
    if kind in ("string", "translated_string"):
        parts = []
        for child in node.named_children:
            if child.type != "string_content":
                return _text(node), False
            parts.append(re.sub(r'\\([$`"\\])', r"\1", _text(child).replace("\\\n", "")))
        return "".join(parts), True
    if kind == "concatenation":
        values = [_value(child) for child in node.named_children]
        if all(known for _, known in values) and len(node.named_children) == len(node.children):
            return "".join(value for value, _ in values), True
        return _text(node), False
    return _text(node), False


def _ansi_c(body: str) -> str | None:
    """Decode the inside of ``$'...'``; None when it uses escapes this does not model (``\\c``, ``\\e``)."""
    if re.search(r"\\[ceE]", body):
        return None
    try:
        return codecs.decode(body.replace("\\'", "'").encode("latin-1", "backslashreplace"), "unicode_escape")
    except (UnicodeDecodeError, ValueError):
        return None


def _redirects(command: Node) -> tuple[str, ...]:
    """Redirections of a command (its own, and those of the statement it is the body of), as text."""
    nodes = list(command.children_by_field_name("redirect"))
    parent = command.parent
    if parent is not None and parent.type == "redirected_statement" and parent.child_by_field_name("body") == command:
        nodes.extend(parent.children_by_field_name("redirect"))
    shown = []
    for node in nodes:
        if node.type == "file_redirect":
            shown.append(" ".join(_text(child) for child in node.children))
    return tuple(shown)
