"""Test code of any form as units for the checker process (`checker`): what `parse_tests` makes of
Python tests that are not all of the simple assert forms.

The test code is trusted (like the config). Each top-level statement is one unit, run in order in
one namespace of the checker process, and after them one unit per test the code defines: each
pytest-style `test_*` function and each `test*` method of a `unittest.TestCase` class (or of a
pytest-style `Test*` class). A setup unit (a definition, an import, an assignment, a bare call of
the solution such as `sort_in_place(xs)`) that raises fails the whole row. Any other unit is a **case** when it raises (a failure) or when it passes
having called the solution (itself, or the setup units since the previous case): a statement that
never touches the solution (`print("All tests passed!")`, a docstring) is no case, and test code
with no case at all scores 0 (`no_tests`). `unittest.main()` / `pytest.main()` do nothing: the
checker runs the tests itself.

Which names are the solution's is decided at run time, not here: every top-level function or class
the solution defines (it says which when it has loaded) is the solution's wherever the test code
does not bind that name itself, as when the test code runs after the solution in one module. A
builtin name (`max`, `sum`, `exit`) is the solution's only when the test code reads no other name
the solution defines: then it is the function under test (MBPP's `sum(10, 15) == 6`); otherwise
the builtin judges the tested function (`round(area(3), 2) == 28.27`: a solution's own `round`
would forge that pass). A free name used only as `name.attr` that is a standard-library
module (`math.isclose` without `import math`) is that module.
"""

from __future__ import annotations

import ast
import copy
import sys

SETUP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign,
         ast.AugAssign)  # fmt: skip
SAME = "__judge_same__"  # the checker's comparison (Python's ==, float_tolerance on floats), bound in its namespace
RUN_FUNCTION = "__judge_run_function__"  # runs one pytest-style test function (testforms)
RUN_METHOD = "__judge_run_method__"  # runs one test method of a class (testforms)


def script_units(trees: list[ast.Module]) -> tuple[list[tuple[str, bool, str]], list[tuple[str, str]]]:
    """(units, names): units as (source to run, counted, source as written: for messages) in order;
    names as (name, 'module') for the free names used only as `name.attr` that are stdlib modules,
    and (name, 'used') for every name the test code reads (`checker`: which of the solution's names
    it tests)."""
    statements = [node for tree in trees for node in tree.body]
    defined = _top_level_names(statements)
    units = [(ast.unparse(_Rewrite().visit(copy.deepcopy(node))), _is_check(node, defined), ast.unparse(node))
             for node in statements]  # fmt: skip
    units += [(f"{runner}({', '.join(map(repr, args))})", True, shown) for runner, args, shown in _tests(statements)]
    return units, _free_modules(statements)


def _is_check(node: ast.stmt, defined: set[str]) -> bool:
    """Whether a top-level statement can be a case: not setup, and not a bare call of a name the test
    code does not define (`sort_in_place(xs)`: a call of the solution whose effect a later assert checks;
    like setup, it fails the row if it raises). `check(f)` is a check: the test code defines `check`."""
    if isinstance(node, SETUP):
        return False
    call = node.value if isinstance(node, ast.Expr) else None
    return not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id not in defined)


def _top_level_names(statements: list[ast.stmt]) -> set[str]:
    """Names the test code binds at top level (an import from `solution` binds the solution's)."""
    names = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "solution":
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _tests(statements: list[ast.stmt]) -> list[tuple[str, tuple, str]]:
    """The tests a test runner would collect, in order: (runner, its arguments, a name for messages)."""
    found = []
    for node in statements:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            found.append((RUN_FUNCTION, (node.name,), f"{node.name}()"))
        elif isinstance(node, ast.ClassDef) and (_is_test_case(node) or node.name.startswith("Test")):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    found.append((RUN_METHOD, (node.name, item.name), f"{node.name}.{item.name}"))
    return found


def _is_test_case(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).endswith("TestCase") for base in node.bases)


class _Rewrite(ast.NodeTransformer):
    """`assert a == b` -> `assert __judge_same__(a, b)` and `!=` -> `not ...` wherever an assert
    stands (float_tolerance reaches them); `unittest.main(...)`, `pytest.main(...)` -> None."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        node = self.generic_visit(node)
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
            same = ast.Call(ast.Name(SAME, ast.Load()), [test.left, test.comparators[0]], [])
            test = same if isinstance(test.ops[0], ast.Eq) else ast.UnaryOp(ast.Not(), same)
        return ast.copy_location(ast.Assert(test, node.msg), node)

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if ast.unparse(node.func) in ("unittest.main", "pytest.main"):
            return ast.copy_location(ast.Constant(None), node)
        return self.generic_visit(node)


def _free_modules(statements: list[ast.stmt]) -> list[tuple[str, str]]:
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
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attribute_only.add(id(node.value))
    for node in (n for s in statements for n in ast.walk(s)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in attribute_only:
            loaded[node.id] = False  # used other than as `name.attr`: not a module
    modules = [(name, "module") for name, only_attributes in loaded.items()
               if only_attributes and name not in bound and name in sys.stdlib_module_names]  # fmt: skip
    return modules + [(name, "used") for name in loaded]  # every name read: which solution names are tested


class Units:
    """The checker's unit verdicts as cases, counted into the judge's `tally` (passed, total,
    answered, first_failure): a unit that fails is a failed case (a setup unit that
    fails zeroes the row); one that passes is a case when the solution was called in it or in the
    setup units since the previous case. Units left unanswered count as failed cases."""

    def __init__(self, cases: list, tally):
        self.cases, self.tally = cases, tally
        self.pending = self.setup_failed = False
        tally.total = 0

    def add(self, message: dict) -> None:
        tally = self.tally
        case = self.cases[tally.answered]
        tally.answered += 1
        self.pending |= type(message.get("calls")) is int and message["calls"] > 0
        if message.get("ok") is not True:
            why = str(message.get("why", ""))[:300]
            tally.first_failure = tally.first_failure or f"test {tally.answered - 1} failed: {why}"
            if not case.counted:  # the test code could not set itself up: nothing after it counts
                self.setup_failed, tally.passed = True, 0
            tally.total += 1
            self.pending = False
        elif case.counted and self.pending:
            tally.total += 1
            tally.passed += not self.setup_failed
            self.pending = False

    def finish(self) -> None:
        self.tally.total += sum(c.counted for c in self.cases[self.tally.answered :])
