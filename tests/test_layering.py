"""The package layering of docs/design.md, read from the source: which package may import which; no file
of the repository points at anything outside it."""
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
    "presets": {"rl", "models", "rewards", "data", "trainer", "sampling", "config", "validation"},
}
for _unit in ("rl", "models", "data", "rewards", "sampling", "config", "validation", "presets"):
    FORBIDDEN[_unit].add("evaluate")  # evaluation sits above the algorithm packages, beside the trainer
FORBIDDEN["envs"] = {"trainer", "sampling", "evaluate", "rl", "models", "config", "validation", "presets", "train",
                     "export", "cli"}  # host-side episodes: data, rewards (the code sandbox), infrastructure
for _unit in ("rl", "models", "data", "rewards", "sampling", "presets"):
    FORBIDDEN[_unit].add("envs")  # config/validation read its registry; the trainer will run it
FORBIDDEN["evaluate"] = {"train", "export"}  # it may use trainer/setup.py; the command lines are not a library
INFRASTRUCTURE = ("checkpoint", "metrics", "wandb_log", "distributed", "sharding", "fs", "faults", "preemption")
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
