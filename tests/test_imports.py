"""utils/ imports in one direction: no cycle between its modules and no reach-in to another module's
private (leading-underscore) names.

Every import is counted, also those inside functions (they hide a cycle from Python at import time but
not from a reader). Parsed with `ast`, so nothing is imported to check it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "utils"
# Reach-ins waiting on a rename in files being changed elsewhere (gemv.py: import `require`, and the two GEMV
# kernels without their underscore). The test fails when one is fixed, so this list only shrinks.
KNOWN_REACH_INS: set = set()


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(current: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of `from <level dots><module> import ...` written in module `current`."""
    if level == 0:
        return module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import in `path` of a module in `modules`."""
    current = module_name(path, root)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            target = resolve(current, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                if sub in modules:                      # `from . import localize` imports a module
                    found.append((sub, "", node.lineno))
                elif target in modules:
                    found.append((target, alias.name, node.lineno))
    return found


def graph(package_dir: Path, root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """The import graph between the package's modules (a package's __init__ left out as a target, since
    every submodule imports its parent package), and the private-name reach-ins found on the way."""
    files = sorted(package_dir.rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    reach_ins = []
    for f in files:
        me = module_name(f, root)
        for target, name, line in imports_of(f, modules, root):
            if target != me and not me.startswith(target + "."):   # not its own package's __init__
                edges[me].add(target)
            if name.startswith("_") and not name.startswith("__") and target != me:
                reach_ins.append((str(f.relative_to(root)), line, name, target))
    return edges, reach_ins


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself): Tarjan."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_utils_has_no_import_cycle():
    edges, _ = graph(ROOT / PACKAGE)
    found = cycles(edges)
    assert not found, ("import cycles in utils/ (imports inside functions count): "
                       + "; ".join(" <-> ".join(c) for c in found)
                       + ". Move what both sides need into a module both import.")


def test_utils_reaches_into_no_private_name():
    _, found = graph(ROOT / PACKAGE)
    pairs = {(path, name) for path, _, name, _ in found}
    assert KNOWN_REACH_INS <= pairs, f"fixed: {sorted(KNOWN_REACH_INS - pairs)}; take them out of KNOWN_REACH_INS"
    reach_ins = [f"{path}:{line} imports {name} from {target}" for path, line, name, target in found
                 if (path, name) not in KNOWN_REACH_INS]
    assert not reach_ins, ("utils/ modules import another module's leading-underscore names (make them public "
                           "or move them): " + "; ".join(reach_ins))


@pytest.fixture
def toy(tmp_path):
    """A package whose modules are written by each test."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "sub" / "__init__.py").write_text("")

    def write(**files):
        for name, text in files.items():
            (pkg / f"{name.replace('__', '/')}.py").write_text(text)
        return graph(pkg, tmp_path)
    return write


def test_a_cycle_through_an_import_inside_a_function_is_found(toy):
    edges, _ = toy(a="from .b import B\nA = 1\n", b="def f():\n    from .a import A\n    return A\nB = 2\n")
    assert cycles(edges) == [["pkg.a", "pkg.b"]]


def test_a_cycle_through_a_subpackage_and_plain_import_is_found(toy):
    edges, _ = toy(a="import pkg.sub.c\nA = 1\n", b="B = 2\n", sub__c="from ... import b\nfrom ..a import A\n")
    assert cycles(edges) == [["pkg.a", "pkg.sub.c"]]


def test_one_direction_is_no_cycle(toy):
    edges, _ = toy(a="from .b import B\nA = 1\n", b="import math\nB = 2\n", sub__c="from ..a import A\n")
    assert cycles(edges) == []


def test_a_private_name_reach_in_is_found_and_a_dunder_is_not(toy):
    _, reach_ins = toy(a="from .b import _helper, __version__\nA = 1\n", b="def _helper(): pass\n__version__ = 1\n")
    assert reach_ins == [("pkg/a.py", 1, "_helper", "pkg.b")]
