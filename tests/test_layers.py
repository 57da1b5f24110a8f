"""The house rules of the package's layout (docs/architecture.md), checked on the source:

* imports only go downward: api -> core -> runners -> {schedule, shm, transport, tuning,
  store} -> observe -> leaves (LAYERS below says exactly what each layer may import);
* no import cycles (computed from the import graph, named when found);
* no module imports the package from inside a function (the way cycles used to hide); a
  package's lazy names (its `_LAZY` table, pycollective._lazy) count as its imports;
* no mutable module-level state outside the documented registries (REGISTRIES).

Sans-IO: the source is parsed with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "pycollective"

# Each layer and the layers it may import (besides itself). "leaf" are the modules at the
# top of the package named _x.py (and the compiled _native); "top" are the package root,
# the subcommands and the integrations built on the API.
LAYERS: dict[str, set[str]] = {
    "leaf": set(),
    "observe": {"leaf"},
    "schedule": {"leaf"},
    "store": {"leaf"},
    "transport": {"observe", "leaf"},
    "shm": {"observe", "leaf"},
    "tuning": {"schedule", "leaf"},
    "runners": {"transport", "shm", "schedule", "tuning", "store", "observe", "leaf"},
    "core": {"runners", "transport", "shm", "schedule", "tuning", "store", "observe", "leaf"},
    "api": {
        "core",
        "runners",
        "transport",
        "shm",
        "schedule",
        "tuning",
        "store",
        "observe",
        "leaf",
    },
    "top": {
        "top",
        "api",
        "core",
        "runners",
        "transport",
        "shm",
        "schedule",
        "tuning",
        "store",
        "observe",
        "leaf",
    },
}
FOLDERS = {
    "observe",
    "schedule",
    "store",
    "transport",
    "shm",
    "tuning",
    "runners",
    "core",
    "api",
}

# Module-level state that is allowed, each with the reason it exists (the only ones).
REGISTRIES: dict[tuple[str, str], str] = {
    ("pycollective.api._default", "DEFAULT"): "torch's API is module-level: the default group",
    ("pycollective._config", "_SAID"): "one-time warnings already given by this process",
    ("pycollective.observe.flight", "_current"): "the recorder SIGUSR1 dumps (weak)",
    ("pycollective.observe.flight", "_signal_installed"): "the SIGUSR1 handler, installed once",
    ("pycollective.observe.timeline", "_current"): "one timeline per process, for every World",
    ("pycollective.observe.timeline", "WAIT"): "seconds blocked on peers, while a timeline records",
    ("pycollective.shm.shared", "_REGISTRY"): "this process's live shared-memory blocks",
    ("pycollective._serialize", "_chosen"): "the object serializer chosen by use()",
    ("pycollective.torch._store", "_alive"): "torch keeps only the C++ half of our stores",
    ("pycollective.torch._work", "_alive"): "a C++ Work outlives its Python object: getFuture",
    ("pycollective.torch._work", "_sweep_at"): "when to sweep _alive next",
    ("pycollective.torch._work", "_levels"): "one completion thread per nesting of callbacks",
    ("pycollective.torch._work", "_tls"): "which completion level a thread runs (thread-local)",
    ("pycollective.torch._work", "_flavours"): "cache: our error classes mixed with torch's",
    ("pycollective.torch._forms", "_calls"): "whether the call being issued is async (per thread)",
    ("pycollective._buffers", "_torch_dtypes"): "cache: torch dtype -> ours, filled on first use",
    ("pycollective.api.collectives", "_checked_ops"): "cache: (op, dtype) pairs already checked",
    ("pycollective.torch._forms", "_our_ops"): "cache: torch's RedOpType -> ours, on first use",
    ("pycollective.torch._forms", "_by_reduce_op"): "cache: torch's ReduceOp -> ours, first use",
}

_MUTATORS = {
    "append",
    "extend",
    "insert",
    "add",
    "update",
    "setdefault",
    "pop",
    "popitem",
    "clear",
    "remove",
    "discard",
    "appendleft",
    "popleft",
}
_CONTAINERS = {"dict", "list", "set", "deque", "defaultdict", "OrderedDict", "Counter"}


# ---------------------------------------------------------------------- the graph


def module_files(root: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package and its file (a compiled extension counts as its built
    library or, unbuilt, the folder of its sources: _native, csrc/ beside src/)."""
    out = {}
    for path in sorted((root / package).glob("*.so")) + sorted((root / package).glob("*.c")):
        out[f"{package}.{path.name.split('.')[0]}"] = path
    native = root.parent / "csrc"
    if package == PACKAGE and native.is_dir() and f"{package}._native" not in out:
        out[f"{package}._native"] = native
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def module_assignments(tree: ast.Module) -> Iterator[tuple[ast.stmt, list[ast.expr], ast.expr]]:
    """(statement, targets, value) of every module-level assignment with a value."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            yield node, node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            yield node, [node.target], node.value


def lazy_table(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of every entry of the module-level `_LAZY` table ("module" or
    "module:attribute"): the imports pycollective._lazy makes on first use."""
    found = []
    for node, targets, value in module_assignments(tree):
        if not any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
            continue
        assert isinstance(value, ast.Dict), f"line {node.lineno}: _LAZY must be a dict literal"
        for v in value.values:
            assert isinstance(v, ast.Constant) and isinstance(v.value, str), (
                f"line {node.lineno}: _LAZY's targets must be string literals"
            )
            found.append((v.value.partition(":")[0], v.lineno))
    return found


def imports(
    module: str, path: Path, known: set[str], package: str = PACKAGE
) -> list[tuple[str, bool, int]]:
    """(imported module, inside a function?, line) for every import of the package, the
    lazy ones of its `_LAZY` table included (as imports at the top: edges like any)."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, bool, int]] = [
        (target, False, line)
        for target, line in lazy_table(tree)
        if target.split(".")[0] == package
    ]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue  # type-only imports run nothing
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == package:
                        found.append((alias.name, in_function, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = _resolve(module, _is_package(path), child.level, child.module)
                else:
                    base = child.module or ""
                if base.split(".")[0] != package:
                    continue
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    found.append((sub if sub in known else base, in_function, child.lineno))
            visit(child, inner)

    visit(tree, False)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "top"
    if parts[1] in FOLDERS:
        return parts[1]
    if len(parts) == 2 and parts[1].startswith("_") and parts[1] != "__main__":
        return "leaf"
    return "top"  # __main__, cli, torch, ps, elastic, ...


def graph(root: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    files = module_files(root, package)
    known = set(files)
    edges: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        if path.suffix != ".py":
            continue  # compiled: imports nothing of ours
        for target, _, _ in imports(module, path, known, package):
            if target in known and target != module:
                edges[module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


# ---------------------------------------------------------------------- the rules


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_planted_cycle_is_found(tmp_path) -> None:
    """The cycle check on a small package with a cycle a -> b -> c -> a hidden behind a
    relative import: it must name all three."""
    pkg = tmp_path / "planted"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..c import thing\n")
    (pkg / "c.py").write_text("from . import a\nthing = 1\n")
    (pkg / "d.py").write_text("from . import a\n")  # depends on the cycle, not in it
    assert cycles(graph(tmp_path, "planted")) == [["planted.a", "planted.c", "planted.sub.b"]]


def test_a_planted_lazy_cycle_is_found(tmp_path) -> None:
    """A lazy name (a `_LAZY` table) is an import for the checks: a -> b eagerly and b -> a
    through b's table is a cycle, and an entry that is not a string literal is refused."""
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text('_LAZY = {"thing": "planted.a:thing"}\n')
    assert cycles(graph(tmp_path, "planted")) == [["planted.a", "planted.b"]]
    (pkg / "b.py").write_text('NAME = "planted.a"\n_LAZY = {"thing": NAME}\n')
    with pytest.raises(AssertionError, match="string literals"):
        graph(tmp_path, "planted")


def test_the_package_has_lazy_names_the_checks_see() -> None:
    """The lazy tables of the package are read (so a lazy import cannot hide a cycle or
    an upward import): the store's etcd client is one of its edges."""
    assert "pycollective.store.etcd" in graph()["pycollective.store"]


def test_imports_only_go_downward() -> None:
    files = module_files()
    bad = []
    for module, targets in graph().items():
        mine = layer(module)
        for target in sorted(targets):
            theirs = layer(target)
            if theirs != mine and theirs not in LAYERS[mine]:
                bad.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert files and not bad, "imports going up the layers:\n" + "\n".join(bad)


def test_no_package_imports_inside_functions() -> None:
    files = module_files()
    known = set(files)
    bad = [
        f"{files[m].relative_to(SRC)}:{line} imports {target}"
        for m in files
        if files[m].suffix == ".py"
        for target, in_function, line in imports(m, files[m], known)
        if in_function
    ]
    assert not bad, "imports of the package inside functions (import at the top):\n" + "\n".join(
        bad
    )


def _state_names(module: str, path: Path) -> set[str]:
    """Module-level names this module treats as mutable state: assigned with `global` in
    a function, or bound at module level to a container (or an object) that the module
    then changes in place."""
    tree = ast.parse(path.read_text(), str(path))
    state: set[str] = set()
    bound: dict[str, str] = {}  # name -> "container" | "object"
    for _node, targets, value in module_assignments(tree):
        kind = None
        if isinstance(value, (ast.Dict, ast.List, ast.Set)):
            kind = "container"
        elif isinstance(value, ast.Call):
            fn = value.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
            kind = "container" if name in _CONTAINERS else "object"
        for t in targets:
            if isinstance(t, ast.Name) and kind:
                bound[t.id] = kind
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            state.update(node.names)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                    if bound.get(t.value.id) == "container":
                        state.add(t.value.id)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    if bound.get(t.value.id) == "object":
                        state.add(t.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (
                isinstance(owner, ast.Name)
                and node.func.attr in _MUTATORS
                and bound.get(owner.id) == "container"
            ):
                state.add(owner.id)
    return state


def test_module_state_only_in_documented_registries() -> None:
    bad = []
    for module, path in module_files().items():
        if path.suffix != ".py":
            continue
        for name in sorted(_state_names(module, path)):
            if (module, name) not in REGISTRIES:
                bad.append(f"{module}.{name}")
    assert not bad, (
        "mutable module-level state outside the registries of tests/test_layers.py "
        "(keep state on the World or the group; a warn-once flag is _config.first_time):\n"
        + "\n".join(bad)
    )


# Leaves that the others build on for safety may import less than a leaf may: only these.
LEAF_IMPORTS = {"pycollective._files": {"pycollective._errors"}}


def test_safety_leaves_import_only_the_errors() -> None:
    edges = graph()
    bad = {m: sorted(edges[m] - allowed) for m, allowed in LEAF_IMPORTS.items() if m in edges}
    assert set(bad) == set(LEAF_IMPORTS) and not any(bad.values()), bad


@pytest.mark.parametrize(
    "module, expected",
    [
        ("pycollective._errors", "leaf"),
        ("pycollective._files", "leaf"),
        ("pycollective.observe.flight", "observe"),
        ("pycollective.runners.arena", "runners"),
        ("pycollective.cli.run", "top"),
        ("pycollective.torch._backend", "top"),
        ("pycollective", "top"),
        ("pycollective.__main__", "top"),
    ],
)
def test_layer_names(module: str, expected: str) -> None:
    assert layer(module) == expected


# ---------------------------------------------------------------------- the prose rules

# What a schedule (pure data: rounds of Send/Recv/Copy) may import from outside the
# package: computation only. Anything else (socket, select, os, threading, the transport)
# could do I/O, so a schedule that needs it is no longer sans-IO.
SCHEDULE_MAY_IMPORT = {
    "__future__",
    "bisect",
    "collections",
    "collections.abc",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "math",
    "numpy",
    "operator",
    "typing",
    "zlib",
}
# Builtins that read or write outside the process.
_IO_BUILTINS = {"open", "print", "input", "breakpoint", "__import__", "exec", "eval"}


def outside_imports(path: Path, package: str = PACKAGE) -> list[tuple[str, int]]:
    """(module, line) of every import from outside the package, anywhere in the file
    (inside functions too: a lazy import does I/O as well as any)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] != package]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != package:
                found.append((node.module, node.lineno))
    return found


def schedule_io(root: Path = SRC, package: str = PACKAGE) -> list[str]:
    """Where schedule/, or a module of the package it imports (directly or not), imports
    something outside SCHEDULE_MAY_IMPORT, calls an I/O builtin or imports the transport."""
    files = module_files(root, package)
    edges = graph(root, package)
    todo = [m for m in files if m.startswith(f"{package}.schedule")]
    seen: set[str] = set()
    bad = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = files[module]
        if path.suffix != ".py":
            bad.append(f"{module} is compiled: nothing says what it does")
            continue
        where = path.relative_to(root)
        for target in sorted(edges[module]):
            if target.split(".")[1:2] == ["transport"]:
                bad.append(f"{where} imports {target}")
            todo.append(target)
        for name, line in outside_imports(path, package):
            if name not in SCHEDULE_MAY_IMPORT:
                bad.append(f"{where}:{line} imports {name}")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in _IO_BUILTINS
            ):
                bad.append(f"{where}:{node.lineno} calls {node.func.id}()")
    return sorted(bad)


def test_a_schedule_never_touches_a_socket() -> None:
    bad = schedule_io()
    assert not bad, (
        "schedule/ is sans-IO (docs/architecture.md): its algorithms are data, and the "
        "executor (runners/executor.py) is the only place they meet I/O:\n" + "\n".join(bad)
    )


def test_a_planted_schedule_io_is_found(tmp_path) -> None:
    """The check on a small package whose schedule does I/O three ways: directly, through
    a leaf that imports socket, and through the transport."""
    pkg = tmp_path / "planted"
    for folder in ("schedule", "transport"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_net.py").write_text("import socket\n")
    (pkg / "_math.py").write_text("import math\n")
    (pkg / "transport" / "tcp.py").write_text("X = 1\n")
    (pkg / "schedule" / "ring.py").write_text(
        "import numpy as np\nfrom .. import _math, _net\n\ndef f():\n    import select\n"
    )
    (pkg / "schedule" / "tree.py").write_text(
        "from ..transport.tcp import X\n\ndef g():\n    print(X)\n"
    )
    assert schedule_io(tmp_path, "planted") == [
        "planted/_net.py:1 imports socket",
        "planted/schedule/ring.py:5 imports select",
        "planted/schedule/tree.py imports planted.transport.tcp",
        "planted/schedule/tree.py:4 calls print()",
    ]


def runner_names(root: Path = SRC, package: str = PACKAGE) -> set[str]:
    """What would name a runner: every public class of runners/ but the protocol (_base.py), the
    modules of runners/, and the algorithm names runners own rather than schedule/ (the
    wire's table less the schedules' names)."""
    folder = root / package / "runners"
    names = {p.stem for p in folder.glob("*.py")} - {"__init__", "_base"}
    for path in folder.glob("*.py"):
        if path.name == "_base.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        names |= {n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name[0] != "_"}
    wire = root / package / "transport" / "_wire.py"
    schedules = {p.stem for p in (root / package / "schedule").glob("*.py")}
    if wire.exists():
        for node in ast.walk(ast.parse(wire.read_text())):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == "ALGO_CODE"
                and isinstance(node.value, ast.Dict)
            ):
                names |= {
                    k.value
                    for k in node.value.keys
                    if isinstance(k, ast.Constant) and k.value not in schedules
                }
    return names


def names_a_runner(path: Path, names: set[str]) -> list[str]:
    """Where the code of `path` names one of `names`: an identifier, an attribute, an
    import (module or name) or a string that is not a docstring; and where its text
    (docstrings, comments) names a runner class."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                docstrings.add(id(body[0].value))
    bad = []
    for node in ast.walk(tree):
        said: list[str] = []
        if isinstance(node, ast.Name):
            said = [node.id]
        elif isinstance(node, ast.Attribute):
            said = [node.attr]
        elif isinstance(node, ast.alias):
            said = [node.name.split(".")[-1], *(node.name.split("."))]
        elif isinstance(node, ast.ImportFrom):
            said = (node.module or "").split(".")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                said = [node.value]
        for word in said:
            if word in names:
                bad.append(f"{path.name}:{getattr(node, 'lineno', '?')} names {word}")
    classes = {n for n in names if n[:1].isupper()}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for word in classes:
            if word in re.findall(r"[A-Za-z_]\w*", line):
                bad.append(f"{path.name}:{number} mentions {word}")
    return sorted(set(bad))


def test_the_group_never_names_a_runner() -> None:
    names = runner_names()
    assert {"ArenaRunner", "ScheduledRunner", "arena", "shm", "hierarchical"} <= names
    bad = names_a_runner(SRC / PACKAGE / "core" / "group.py", names)
    assert not bad, (
        "core/group.py knows runners only through the protocol (runners/_base.py) and the "
        "registry (docs/architecture.md, 'Adding a way to run calls'):\n" + "\n".join(bad)
    )


def test_a_planted_runner_name_is_found(tmp_path) -> None:
    """The check on a group that names a runner in each way it can."""
    pkg = tmp_path / "planted"
    (pkg / "runners").mkdir(parents=True)
    (pkg / "transport").mkdir()
    (pkg / "schedule").mkdir()
    (pkg / "schedule" / "ring.py").write_text("")
    (pkg / "runners" / "_base.py").write_text("class Runner: ...\n")
    (pkg / "runners" / "arena.py").write_text("class ArenaRunner: ...\n")
    (pkg / "transport" / "_wire.py").write_text("ALGO_CODE: dict = {'ring': 1, 'shm': 2}\n")
    group = pkg / "group.py"
    group.write_text(
        '"""Runs calls; the compiled arena stands in for ArenaRunner."""\n'
        "from .runners import Runner\n"
        "from .runners.arena import ArenaRunner\n"
        "def f(r: Runner):\n"
        '    """ring and shm in a docstring are words, not names."""\n'
        "    # the ArenaRunner, in a comment\n"
        "    return r.algorithm == 'shm' or isinstance(r, ArenaRunner)\n"
    )
    names = runner_names(tmp_path, "planted")
    assert names == {"arena", "ArenaRunner", "shm"}
    assert names_a_runner(group, names) == [
        "group.py:1 mentions ArenaRunner",
        "group.py:3 mentions ArenaRunner",
        "group.py:3 names ArenaRunner",
        "group.py:3 names arena",
        "group.py:6 mentions ArenaRunner",
        "group.py:7 mentions ArenaRunner",
        "group.py:7 names ArenaRunner",
        "group.py:7 names shm",
    ]
