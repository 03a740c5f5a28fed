"""The code's shape, checked from the source (ast): no import cycles, no private names imported across
modules, analyzers in functions of about a screen. Imports under `if TYPE_CHECKING:` are annotations
only and do not count; function-local imports do (a cycle hidden inside a function is still one)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tracekit", "reports")
MAX_FUNCTION_LINES = 60
LENGTH_CHECKED = ("tracekit/analyze", "tracekit/parse")
"""Folders whose functions must stay within MAX_FUNCTION_LINES."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            out[_module_name(path)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


SOURCES = _sources()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _resolve(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, tree: ast.Module):
    """(imported module, imported name or None, line) for each runtime import of our packages."""
    is_pkg = path.name == "__init__.py"
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, is_pkg)
            for a in node.names:
                sub = f"{target}.{a.name}"
                yield (sub, None, node.lineno) if sub in SOURCES else (target, a.name, node.lineno)


def _ours(name: str) -> str | None:
    """The module of ours `name` refers to (a package's submodule, or the package itself)."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports at run time."""
    g: dict[str, set[str]] = {}
    for module, (path, tree) in SOURCES.items():
        deps = g.setdefault(module, set())
        for target, _, _ in _imports(module, path, tree):
            dst = _ours(target)
            if dst is not None and dst != module and not module.startswith(dst + "."):
                deps.add(dst)  # a package's own __init__ is not a cycle with its modules
    return g


def test_the_import_graph_has_no_cycles():
    g = import_graph()
    assert len(g) > 50 and "tracekit.derive.matching" in g["tracekit.analyze.stragglers"]
    try:
        graphlib.TopologicalSorter(g).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_checker_finds_a_cycle():
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({"a": {"b"}, "b": {"c"}, "c": {"a"}}).prepare()


def test_the_checker_sees_a_cycle_hidden_in_a_function():
    mod_a = ast.parse("def f():\n    from tracekit.b import x\n")
    names = list(_imports("tracekit.a", REPO / "tracekit" / "a.py", mod_a))
    assert names == [("tracekit.b", "x", 2)]
    guarded = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tracekit.b import x\n")
    assert [n for n in _imports("tracekit.a", REPO / "tracekit" / "a.py", guarded) if n[0] == "tracekit.b"] == []


def test_no_private_names_are_imported_across_modules():
    bad = []
    for module, (path, tree) in SOURCES.items():
        for target, name, line in _imports(module, path, tree):
            if name and name.startswith("_") and not name.startswith("__") and _ours(target):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name} from {target}")
    assert bad == []


def _long_functions(folder: str) -> list[str]:
    out = []
    for module, (path, tree) in SOURCES.items():
        if not str(path.relative_to(REPO)).startswith(folder + "/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    return out


@pytest.mark.parametrize("folder", LENGTH_CHECKED)
def test_functions_are_about_a_screen(folder):
    assert _long_functions(folder) == []


# The layers, bottom to top (DESIGN: capture → parse → tables → derived facts → analyzers → findings →
# assessment → reports). A package may import those below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tracekit.errors", "tracekit.process_env", "tracekit.config", "tracekit.layout", "tracekit.collectives",
     "tracekit.findings", "tracekit.document"),
    ("tracekit.tables",),
    ("tracekit.parse", "tracekit.record", "tracekit.model", "tracekit.simulate", "tracekit.advise"),
    ("tracekit.derive",),
    ("tracekit.whatif",),
    ("tracekit.analyze",),
    ("tracekit.assess",),
    ("tracekit.flow", "tracekit.engines"),
    ("reports",),
    ("tracekit.analysis", "tracekit.compare", "tracekit.export", "tracekit.notebook"),
    ("tracekit.cli",),
)
SAME_LAYER_ALLOWED = {("tracekit.advise", "tracekit.simulate"), ("tracekit.advise", "tracekit.model"),
                      ("tracekit.simulate", "tracekit.model"), ("tracekit.record", "tracekit.parse"),
                      ("tracekit.findings", "tracekit.errors"), ("tracekit.layout", "tracekit.errors"),
                      ("tracekit.parse", "tracekit.record"), ("tracekit.analysis", "tracekit.compare"),
                      ("tracekit.compare", "tracekit.analysis"), ("tracekit.notebook", "tracekit.analysis"),
                      ("tracekit.notebook", "tracekit.export"), ("tracekit.export", "tracekit.analysis"),
                      ("tracekit.simulate", "tracekit.record"), ("tracekit.flow", "tracekit.engines"),
                      ("tracekit.engines", "tracekit.flow"), ("tracekit.document", "tracekit.findings")}
"""Imports between packages of one layer that the design allows (the advisor runs the simulator on the
memory model; recording writes what the parser reads and reads its discovery rules, the simulator writes
the recorder's comms-log format; the top-level entry points call each other; the document reads which finding kinds
are about the analysis from the findings' declaration). `reports` reads only the
analysis document (tracekit.document) and imports nothing else of tracekit's."""


def _layer_of(module: str) -> tuple[int, str] | None:
    for i, layer in enumerate(LAYERS):
        for pkg in layer:
            if module == pkg or module.startswith(pkg + "."):
                return i, pkg
    return None


def _layer_violations() -> list[str]:
    bad = []
    for module, deps in import_graph().items():
        src = _layer_of(module)
        for dep in deps:
            dst = _layer_of(dep)
            if src is None or dst is None or src[1] == dst[1]:
                continue
            if dst[0] > src[0] or (dst[0] == src[0] and (src[1], dst[1]) not in SAME_LAYER_ALLOWED):
                bad.append(f"{module} (layer {src[0]}, {src[1]}) imports {dep} (layer {dst[0]}, {dst[1]})")
    return sorted(bad)


def test_every_module_has_a_layer():
    assert [m for m in SOURCES if m.startswith("tracekit.") and _layer_of(m) is None
            and m not in ("tracekit.__main__",)] == []


def test_no_package_imports_a_layer_above_it():
    assert _layer_violations() == []


def test_the_named_lower_layers_never_import_the_analyzers():
    lower = ("tracekit.whatif", "tracekit.simulate", "tracekit.model", "tracekit.advise", "tracekit.tables",
             "tracekit.parse", "tracekit.record", "tracekit.derive", "tracekit.findings")
    bad = [f"{m} imports {d}" for m, deps in import_graph().items() if m.startswith(lower)
           for d in deps if d == "tracekit.analyze" or d.startswith(("tracekit.analyze.", "tracekit.assess"))]
    assert bad == []


def test_findings_import_nothing_of_ours_but_errors():
    bad = [f"{m} imports {d}" for m, deps in import_graph().items() if m.startswith("tracekit.findings")
           for d in deps if not d.startswith(("tracekit.findings", "tracekit.errors"))]
    assert bad == []


def _all_imports() -> dict[str, set[str]]:
    """module -> modules of ours it imports in any form (annotation-only imports included)."""
    g: dict[str, set[str]] = {}
    for module, (path, tree) in SOURCES.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in SOURCES else base for a in node.names]
            for t in targets:
                dst = _ours(t)
                if dst and dst != module and not module.startswith(dst + "."):
                    g.setdefault(module, set()).add(dst)
    return g


def test_no_two_modules_import_each_other_even_for_annotations():
    g = _all_imports()
    pairs = sorted({tuple(sorted((a, b))) for a, deps in g.items() for b in deps if a in g.get(b, set())})
    assert pairs == []


def test_the_layer_checker_sees_an_upward_import():
    assert _layer_of("tracekit.whatif.build")[0] < _layer_of("tracekit.analyze.stragglers")[0]
    assert _layer_of("tracekit.findings.finding")[0] == 0 and _layer_of("tracekit.cli.main")[0] == len(LAYERS) - 1
    assert _layer_of("reports.html_report")[0] < _layer_of("tracekit.analysis")[0]


DEGREE_PACKAGES = ("tracekit", "instrumented_runtime")
"""Where parallel degrees may be declared: the library and the runtime."""
DEGREES_CLASS = "tracekit/layout.py:ParallelLayout"


def _declared_attributes(cls: ast.ClassDef) -> set[str]:
    """Names a class declares as its data: class-level annotated or plain assignments (dataclass, msgspec
    and NamedTuple fields, class attributes) and `self.X = ...` / `self.X: T = ...` in its own methods.
    Properties and methods are not data: a property that reads the one layout is not a second copy."""
    out: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
                    sub, (ast.AnnAssign, ast.AugAssign)) else []
                for t in targets:
                    for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        if (isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name)
                                and el.value.id == "self"):
                            out.add(el.attr)
    return out


def degree_classes(trees: dict[str, ast.Module]) -> list[str]:
    """`path:Class` of every class that declares both a `tp` and a `pp` (a class of parallel degrees)."""
    return sorted(f"{path}:{node.name}" for path, tree in trees.items() for node in ast.walk(tree)
                  if isinstance(node, ast.ClassDef) and {"tp", "pp"} <= _declared_attributes(node))


def test_exactly_one_class_of_parallel_degrees():
    trees = {str(p.relative_to(REPO)): ast.parse(p.read_text(encoding="utf-8"), str(p))
             for pkg in DEGREE_PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    assert len(trees) > 100 and "instrumented_runtime/parallel_dims.py" in trees
    assert degree_classes(trees) == [DEGREES_CLASS]


def test_the_degree_rule_sees_fields_attributes_and_assignments():
    src = ("class A:\n    tp: int = 1\n    pp: int = 1\n"          # dataclass / msgspec fields
           "class B:\n    def __init__(self):\n        self.tp, self.pp = 1, 1\n"
           "class C:\n    tp = 1\n    def f(self):\n        self.pp: int = 2\n"
           "class D:\n    tp: int = 1\n    @property\n    def pp(self):\n        return 1\n"  # a property is not data
           "class E:\n    def f(self, other):\n        other.tp = other.pp = 1\n")          # not its own
    assert degree_classes({"x.py": ast.parse(src)}) == ["x.py:A", "x.py:B", "x.py:C"]
