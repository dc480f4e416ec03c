"""The package layering of docs/design.md, read from the source: which package may import which; no import
cycle among the modules of jaxrl_llm; no private name imported from another module; no file of the
repository points at anything outside it."""
import ast
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "jaxrl_llm")

# Package (or top-level module) of jaxrl_llm -> the ones it must never import, directly or lazily.
FORBIDDEN = {
    "rl": {"models", "rewards", "data", "trainer", "sampling", "config", "sharding", "distributed", "checkpoint",
           "metrics", "fs", "faults", "export", "train", "cli"},
    "models": {"rl", "rewards", "data", "trainer", "sampling", "config"},
    "data": {"rewards", "rl", "models", "trainer", "sampling"},
    "rewards": {"rl", "trainer", "sampling", "config"},
    "sampling": {"rl", "rewards", "data", "trainer", "config"},
    "config": {"trainer", "models", "rewards", "sampling"},
    "validation": {"trainer", "models", "rewards", "sampling", "config"},
    "field_names": {"trainer", "models", "rewards", "sampling", "config", "validation", "rl", "data", "envs"},
    "presets": {"rl", "models", "rewards", "data", "trainer", "sampling", "config", "validation"},
}
for _unit in ("rl", "models", "data", "rewards", "sampling", "config", "validation", "field_names", "presets"):
    FORBIDDEN[_unit].add("evaluate")  # evaluation sits above the algorithm packages, beside the trainer
FORBIDDEN["envs"] = {"trainer", "sampling", "evaluate", "rl", "models", "config", "validation", "presets", "train",
                     "export", "cli"}  # host-side episodes: data, rewards (the code sandbox), infrastructure
for _unit in ("rl", "models", "data", "rewards", "sampling", "presets"):
    FORBIDDEN[_unit].add("envs")  # config/validation read its registry; the trainer will run it
FORBIDDEN["evaluate"] = {"train", "export"}  # it may use trainer/setup.py; the command lines are not a library
INFRASTRUCTURE = ("checkpoint", "metrics", "wandb_log", "distributed", "sharding", "fs", "faults", "preemption",
                  "compile_options")
for _unit in INFRASTRUCTURE:  # the infrastructure modules know nothing of the algorithm packages
    FORBIDDEN[_unit] = {"rl", "models", "rewards", "data", "trainer", "sampling", "config", "evaluate", "envs"}


def imported_units(path: str, own: str) -> set[str]:
    """The jaxrl_llm packages/modules a file imports (import statements anywhere, importlib strings)."""
    src = open(path, encoding="utf-8").read()
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names] if node.module == "jaxrl_llm" else [])
        else:
            continue
        out.update(n.split(".")[1] for n in names if n.startswith("jaxrl_llm.") and len(n.split(".")) > 1)
    out.update(re.findall(r"[\"']jaxrl_llm\.(\w+)", src))  # lazy imports by name
    return out - {own}


def units():
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), PKG)
                yield rel.split(os.sep)[0].removesuffix(".py"), os.path.join(d, f)


def test_the_scanner_sees_every_import_form(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import jaxrl_llm.models\nfrom jaxrl_llm import rl\nfrom jaxrl_llm.data.tasks import x\n"
                 "def g():\n    from jaxrl_llm.rewards import y\nm = importlib.import_module('jaxrl_llm.trainer')\n")
    assert imported_units(str(f), "sampling") == {"models", "rl", "data", "rewards", "trainer"}


@pytest.mark.parametrize("unit", sorted(FORBIDDEN))
def test_package_layering(unit):
    bad = {os.path.relpath(path, ROOT): sorted(imported_units(path, unit) & FORBIDDEN[unit])
           for u, path in units() if u == unit}
    assert bad and not any(bad.values()), {f: names for f, names in bad.items() if names}


def test_no_file_points_outside_the_repository():
    """A contributor who clones the repository must be able to follow every pointer."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"DESIGN section|DESIGN §|shared/references|\.\./shared|DESIGN\.md")
    hits = []
    for f in files:
        if f.endswith((".py", ".md", ".sh", ".txt", ".ini", ".cfg")) and f != "tests/test_layering.py":
            with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
                hits += [f"{f}:{i}" for i, line in enumerate(fh, 1) if pattern.search(line)]
    assert not hits, hits


def module_imports(path: str, modules: dict[str, str]) -> tuple[set[str], list[str]]:
    """(the jaxrl_llm modules a file imports, anywhere in it; the private names it imports from one),
    a name `from pkg import x` counting as module pkg.x when that is a module."""
    def module_of(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name
    targets, private = set(), []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            targets.update(module_of(a.name) for a in node.names if a.name.startswith("jaxrl_llm"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("jaxrl_llm"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                targets.add(module_of(full) if full in modules else module_of(node.module))
                if a.name.startswith("_") and full not in modules:
                    private.append(f"from {node.module} import {a.name}")
    return targets - {None, ""}, private


def jaxrl_modules(root: str = PKG) -> dict[str, str]:
    """Dotted module name (a package by its own name) -> file, for every .py file under `root`."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle's modules (the strongly connected components of more than one module), by a
    depth-first search from each module: v and w share a cycle iff each reaches the other."""
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for w in graph.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen
    reaches = {v: reach(v) for v in graph}
    cycles = {tuple(sorted(w for w in reaches[v] if v in reaches[w])) for v in graph if v in reaches[v]}
    return sorted(list(c) for c in cycles if len(c) > 1)


def test_import_cycles_are_found():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_module_scanner_sees_private_and_lazy_imports(tmp_path):
    pkg = tmp_path / "jaxrl_llm"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("from jaxrl_llm.sub import b\ndef f():\n    from jaxrl_llm.sub.b import _x, y\n")
    modules = jaxrl_modules(str(pkg))
    assert set(modules) == {"jaxrl_llm", "jaxrl_llm.a", "jaxrl_llm.sub", "jaxrl_llm.sub.b"}
    assert module_imports(modules["jaxrl_llm.a"], modules) == ({"jaxrl_llm.sub.b"}, ["from jaxrl_llm.sub.b import _x"])


def test_no_import_cycles_among_modules():
    """A cycle (even through a lazy import) means neither module can be read, tested or moved alone."""
    modules = jaxrl_modules()
    graph = {m: module_imports(path, modules)[0] - {m} for m, path in modules.items()}
    assert len(graph) > 50
    cycles = import_cycles(graph)
    assert not cycles, cycles


def test_no_private_names_imported_across_modules():
    """A leading underscore says "used only here": another module that needs it gets a public name."""
    modules = jaxrl_modules()
    bad = {m: module_imports(path, modules)[1] for m, path in modules.items()}
    assert not any(bad.values()), {m: names for m, names in bad.items() if names}


def test_tests_import_their_helpers_by_module_name():
    """`pytest tests` puts tests/ on sys.path, not the repository root: a test importing `tests.fixtures_x`
    passes with PYTHONPATH=. and fails on a fresh clone (it did, once, in CI)."""
    bad = []
    for name in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(ROOT, "tests", name), encoding="utf-8").read())
            bad += [f"{name}:{n.lineno}" for n in ast.walk(tree)
                    if (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "tests")
                    or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "tests" for a in n.names))]
    assert not bad, f"import the helper as `from fixtures_x import ...`: {bad}"
