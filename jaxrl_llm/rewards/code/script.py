"""Test code of any form as units for the checker process (`checker`): what `parse_tests` makes of
Python tests that are not all of the simple assert forms.

The test code is trusted (like the config). Each top-level statement is one unit, run in order in
one namespace of the checker process; a unit that is not a definition, an import or an assignment
(an `assert`, a call such as HumanEval's `check(candidate)`, a loop) is one counted case, passed
when it raises nothing; a setup statement that raises fails the whole row. The names the test code uses without defining them (and that are not
builtins) are the solution's: proxies that send their arguments to the sandbox and return its
reply decoded into plain values; `Solution().method(...)` calls `method`. A free name used only
as `name.attr` that is a standard-library module (`math.isclose` without `import math`) is that
module. Every `assert a == b` / `a != b` compares with exact types (`values.same`: `True` is not
`1`, `3.0` is not `3`), as the simple forms do; everything else is Python's own semantics.
"""

from __future__ import annotations

import ast
import builtins
import copy
import sys

SETUP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign,
         ast.AugAssign)  # fmt: skip
SAME = "__judge_same__"  # the checker's exact comparison, bound in its namespace


def script_units(trees: list[ast.Module]) -> tuple[list[tuple[str, bool, str]], list[tuple[str, str]]]:
    """(units, names): units as (source to run, counted, source as written: for messages; the same
    lines) in order; names as (name, 'proxy' | 'module') for the free names. ValueError for a
    `check(candidate)`-style function never called."""
    statements = [node for tree in trees for node in tree.body]
    if not statements:
        return [], []
    _require_calls(statements)
    units = [(ast.unparse(_ExactEquality().visit(copy.deepcopy(node))), not isinstance(node, SETUP), ast.unparse(node))
             for node in statements]  # fmt: skip
    return units, _free_names(statements)


def _require_calls(statements: list[ast.stmt]) -> None:
    """A function of one parameter named `candidate` (HumanEval's `check`) that nothing calls would
    leave the row with nothing to judge: an error, not a pass."""
    calls = (n for s in statements for n in ast.walk(s) if isinstance(n, ast.Call))
    called = {n.func.id for n in calls if isinstance(n.func, ast.Name)}
    for node in statements:
        if isinstance(node, ast.FunctionDef) and [a.arg for a in node.args.args] == ["candidate"]:
            if node.name not in called:
                raise ValueError(f"tests define {node.name}(...) but never call it: "
                                 f"add `{node.name}(<the function to test>)`")  # fmt: skip


class _ExactEquality(ast.NodeTransformer):
    """`assert a == b` -> `assert __judge_same__(a, b)`, `assert a != b` -> `assert not ...`,
    wherever an assert stands (inside `check`, loops)."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
            same = ast.Call(ast.Name(SAME, ast.Load()), [test.left, test.comparators[0]], [])
            test = same if isinstance(test.ops[0], ast.Eq) else ast.UnaryOp(ast.Not(), same)
        return ast.copy_location(ast.Assert(test, node.msg), node)


def _free_names(statements: list[ast.stmt]) -> list[tuple[str, str]]:
    bound, loaded, attribute_only = {SAME}, {}, set()
    for node in (n for s in statements for n in ast.walk(s)):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loaded.setdefault(node.id, True)
            else:
                bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attribute_only.add(id(node.value))
    for node in (n for s in statements for n in ast.walk(s)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in attribute_only:
            loaded[node.id] = False  # used other than as `name.attr`: not a module
    names = []
    for name, only_attributes in loaded.items():
        if name in bound or hasattr(builtins, name):
            continue
        module = only_attributes and name in sys.stdlib_module_names and name != "Solution"
        names.append((name, "module" if module else "proxy"))
    return names
