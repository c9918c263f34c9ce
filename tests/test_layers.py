"""The import rules of docs/design.md, checked on the source itself.

Every module under ``src/saucer`` is parsed (never imported); every import
statement counts, wherever it stands: at module level, inside a function
(a lazy import), under ``if TYPE_CHECKING:``, in a ``try``, or as
``importlib.import_module("saucer...")`` with a literal name. Relative
imports are resolved against the importing module's package.

The rules (the import rules with no exceptions list):

* layers: cli -> ui/service -> agents -> engine -> dispatch -> context -> store;
  a module may import its own package and any package of a lower layer. Of the
  two at one height, the service mounts the web viewer, so ``service`` may
  import ``ui`` and never the other way round; ``queue`` (sessions spread
  over worker processes) runs engine sessions for the service and the CLI,
  beside ``agents``, neither importing the other;
* ``tools``, ``config`` and ``redaction`` import nothing of saucer's other
  packages (they stand beside the layers, usable from any of them);
* ``ufo_config`` (UFO's YAML files read into the settings) imports ``config``
  and nothing else of saucer;
* no file-level import cycle in any package (two files importing each other,
  directly or around a loop, lazily or not, and under ``if TYPE_CHECKING:``
  too: an annotation that names a module which names it back is a circle of
  concerns even though it never runs -- move the shared type down, or give
  the lower module a Protocol);
* no module over 600 formatted lines (``ruff format``, checked by ``make lint``, shapes every line, so
  the file as it stands is the formatted file);
* no optional hook looked up by a literal name at call time (``getattr(x, "name", None)`` or any
  ``getattr`` with a literal name and a default): an optional capability is a Protocol checked once,
  where the object is registered, or an attribute the class declares. ``GETATTR_ALLOWED`` names the
  modules that may, each with its reason.

A new top-level package must be given its place in ``LAYERS`` (or in
``STANDALONE``): an unplaced package fails the test, so the rules cannot be
dodged by adding a package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "saucer"
MAX_LINES = 600

# Modules that may look attributes up by a literal name with a default, and why.
GETATTR_ALLOWED: dict[str, str] = {
    "saucer.tools._schemacache": "reflection: a tool's cache key reads any callable's __annotations__/__defaults__",
    "saucer.context.access": "reflection: an error message names any declared type (a generic alias has no __name__)",
    "saucer.agents.llm.client": "outside data: the fields of a model server's reply objects vary by server and SDK version",
}
# Lower number = lower layer. A module may import from its own package or a lower layer.
LAYERS: dict[str, int] = {
    "store": 0,
    "context": 1,
    "dispatch": 2,
    "engine": 3,
    "agents": 4,
    "queue": 4,
    "ui": 5,
    "service": 6,
    "cli": 7,
    "__main__": 8,  # python -m saucer: runs the CLI
}
# Beside the layers: importable from anywhere, importing nothing of saucer's other packages.
STANDALONE = {"tools", "config", "redaction", "_lazy"}
# Readers of other projects' settings files (UFO's YAML): they fill config's model and import nothing else of saucer.
SETTINGS_READERS = {"ufo_config"}
# The package's own __init__ (a version string) is neither.
ROOT = "__init__"


@dataclass(frozen=True)
class Import:
    source: str  # dotted name of the importing module
    target: str  # dotted name of the imported saucer module (resolved)
    line: int
    lazy: bool  # inside a function (or any block below module level)
    typing_only: bool  # under `if TYPE_CHECKING:`: read by type checkers, never run


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node, with whether it stands inside a function and whether under ``if TYPE_CHECKING:``."""
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, lazy, typing_only = stack.pop()
        yield node, lazy, typing_only
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, inner, True) for child in node.body)
            stack.extend((child, inner, typing_only) for child in node.orelse)
            continue
        stack.extend((child, inner, typing_only) for child in ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(modules: dict[str, Path]) -> list[Import]:
    found: list[Import] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, lazy, typing_only in _walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for alias in node.names:
                    # `from saucer.x import y` imports the module saucer.x.y when there is one.
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets = [node.args[0].value]
            for target in targets:
                if target == "saucer" or target.startswith("saucer."):
                    found.append(Import(module, _known(target, modules), node.lineno, lazy, typing_only))
    return found


def _known(target: str, modules: dict[str, Path]) -> str:
    """The longest prefix of ``target`` that is a module of ours (``saucer.a.b.name`` -> ``saucer.a.b``)."""
    parts = target.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or target


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


MODULES = _modules()
IMPORTS = _imports(MODULES)


def _where(imp: Import) -> str:
    path = MODULES[imp.source].relative_to(SRC.parent)
    kind = "typing-only import" if imp.typing_only else "lazy import" if imp.lazy else "import"
    return f"{path}:{imp.line}: {kind} of {imp.target}"


def test_the_parser_sees_lazy_relative_and_typing_only_imports() -> None:
    """The checker itself: lazy, relative and typing-only imports are all found and resolved."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from ..store import base\n"
        "if TYPE_CHECKING:\n"
        "    from saucer.engine.session import Session\n"
        "def later():\n"
        "    import saucer.agents.follower\n"
        "    from saucer.cli import app\n"
    )
    tree = ast.parse(source)
    found = {
        (_resolve("saucer.engine.round", Path("round.py"), node), lazy, typing_only)
        for node, lazy, typing_only in _walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert found == {
        ("typing", False, False),
        ("saucer.engine", False, False),
        ("saucer.store", False, False),
        ("saucer.engine.session", False, True),
        ("saucer.cli", True, False),
    }
    assert [lazy for node, lazy, _ in _walk(tree) if isinstance(node, ast.Import)] == [True]
    assert any(imp.lazy for imp in IMPORTS), "no lazy import found: the walker is broken"
    assert any(imp.typing_only for imp in IMPORTS), "no typing-only import found: the walker is broken"
    assert len(MODULES) > 50 and len(IMPORTS) > 200


def test_every_package_has_a_place() -> None:
    packages = {_package(m) for m in MODULES}
    unplaced = packages - set(LAYERS) - STANDALONE - SETTINGS_READERS - {ROOT}
    assert not unplaced, (
        f"packages {sorted(unplaced)} have no layer: give each one its place in LAYERS "
        "(or STANDALONE) of tests/test_layers.py and in docs/design.md"
    )


def test_imports_go_down_the_layers() -> None:
    wrong = []
    for imp in IMPORTS:
        src, dst = _package(imp.source), _package(imp.target)
        if src == dst or src not in LAYERS or dst not in LAYERS:
            continue
        if LAYERS[dst] > LAYERS[src] or (LAYERS[dst] == LAYERS[src] and src != dst):
            wrong.append(f"{_where(imp)} ({src} may not import {dst})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(dict.fromkeys(wrong))


def test_standalone_packages_import_nothing_of_saucer() -> None:
    wrong = []
    for imp in IMPORTS:
        src, dst = _package(imp.source), _package(imp.target)
        if src in STANDALONE and dst != src:
            wrong.append(_where(imp))
        if src in SETTINGS_READERS and dst not in (src, "config"):
            wrong.append(_where(imp))
        if src == ROOT and dst != ROOT:
            wrong.append(_where(imp))
    assert not wrong, "tools, config and redaction import nothing of saucer:\n" + "\n".join(dict.fromkeys(wrong))


def _import_graph(imports: list[Import], *, typing_only: bool) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``typing_only``: imports under ``if TYPE_CHECKING:`` count too)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in imports:
        if imp.target in graph and imp.target != imp.source and (typing_only or not imp.typing_only):
            graph[imp.source].add(imp.target)
    return graph


def _explain(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_no_file_level_import_cycle() -> None:
    """Imports that run (at module level or lazily) form no loop: an import order never matters."""
    cycles = _cycles(_import_graph(IMPORTS, typing_only=False))
    assert not cycles, "import cycles:\n" + _explain(cycles)


def test_no_import_cycle_in_any_package_type_only_imports_included() -> None:
    """No package's modules import each other around a loop, counting the imports under
    ``if TYPE_CHECKING:`` (annotations): every package is a tree of concerns, not a knot."""
    cycles = _cycles(_import_graph(IMPORTS, typing_only=True))
    by_package: dict[str, list[list[str]]] = {}
    for cycle in cycles:
        by_package.setdefault(_package(cycle[0]), []).append(cycle)
    assert not cycles, "import cycles (type-only imports included), by package:\n" + "\n".join(
        f"{package}:\n{_explain(found)}" for package, found in sorted(by_package.items())
    )


def test_a_type_only_import_closes_a_cycle() -> None:
    """The checker itself: a loop closed by an import under ``if TYPE_CHECKING:`` is found, and only
    when type-only imports count."""
    a, b = "saucer.engine.session", "saucer.engine.round"
    imports = [Import(a, b, 1, False, False), Import(b, a, 2, False, True)]
    assert _cycles(_import_graph(imports, typing_only=True)) == [sorted([a, b])]
    assert _cycles(_import_graph(imports, typing_only=False)) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_loop() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_600_formatted_lines() -> None:
    """The files as they stand are formatted (``ruff format --check`` in ``make lint``), so their lines count."""
    long = []
    for path in MODULES.values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{path.relative_to(SRC.parent)}: {lines} formatted lines")
    assert not long, (
        f"modules over {MAX_LINES} formatted lines (the rule: at most {MAX_LINES} lines after `ruff format`; "
        "split them where their concerns part, not where lines are saved):\n" + "\n".join(long)
    )


def _literal_getattrs(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``getattr(x, "name", default)`` calls: an optional attribute looked up by a literal name."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) == 3
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            yield node.lineno, node.args[1].value


def test_the_getattr_finder_finds_optional_hooks() -> None:
    source = (
        "a = getattr(x, 'hook', None)\n"
        "b = getattr(x, 'flag', False)\n"
        "c = getattr(x, name, None)\n"  # a name from data (a registry's lookup) is not a literal hook
        "d = getattr(x, 'attr')\n"  # no default: the attribute must be there
    )
    assert list(_literal_getattrs(ast.parse(source))) == [(1, "hook"), (2, "flag")]


def test_no_optional_hook_lookups_by_getattr() -> None:
    """An optional capability is a Protocol checked once where the object is registered, or an attribute
    its class declares, never ``getattr(obj, "name", None)`` at call time."""
    assert set(GETATTR_ALLOWED) <= set(MODULES), "GETATTR_ALLOWED names a module that does not exist"
    found = []
    for module, path in MODULES.items():
        if module in GETATTR_ALLOWED:
            continue
        for line, name in _literal_getattrs(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            found.append(f"{path.relative_to(SRC.parent)}:{line}: getattr(..., {name!r}, <default>)")
    assert not found, (
        "optional hooks looked up by name at call time (make them a Protocol checked once at registration, "
        "or an attribute the class declares; tests/test_layers.py GETATTR_ALLOWED lists the exceptions):\n"
        + "\n".join(found)
    )
