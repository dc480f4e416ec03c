"""Test formats: what the judge sends to the sandbox (inputs only) and what it keeps (expectations).

A row's `tests` is one of:
- a dict `{"inputs": [str, ...], "outputs": [str, ...]}` (or its JSON text): stdin/stdout cases;
- a dict `{"fn_name": name, "inputs": [[arg, ...], ...], "outputs": [value, ...]}`: function calls;
- a string of Python or a list of strings (MBPP, HumanEval, APPS/TACO asserts): test code. When
  every statement is an `import` (skipped), a constant assignment (skipped) or an assert of these
  forms, each assert is one function-call case, compared by the judge itself (the fast path):
    assert f(args) == literal        assert literal == f(args)       assert f(args) != literal
    assert f(args) is None / True / False                            assert f(args) in literal
    assert f(args)   (truthy)        assert not f(args)   (falsy)
    assert math.isclose(f(args), literal[, rel_tol=, abs_tol=])
    assert abs(f(args) - literal) < eps   (or <=)
  where args are literals (keywords too) and f a plain name that is not a builtin's or
  `Solution().method`; each is judged as Python would (`values`: real types, `1 == True`); the
  asserts of a HumanEval-style `def check(candidate): ...` are one case where `check(f)` is called. Any other
  test code runs whole in a checker process of its own, one case per top-level statement that is
  not a definition, import or assignment (`script`, `checker`).
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_llm.rewards.code import script, values


@dataclasses.dataclass(frozen=True)
class Case:
    """One unit the judge runs. kind: 'stdio' (payload: stdin text), 'call' (payload: (fn_name,
    args, kwargs)) or 'script' (payload: (source of one unit, the free names that are stdlib
    modules as (name, 'module') pairs, the unit as written), run by the checker process).
    check: how `expected` is compared: 'eq', 'ne', 'is', 'in', 'truthy', 'falsy', 'isclose'
    (rel_tol/abs_tol), 'abs_lt'/'abs_le' (abs_tol)."""

    kind: str
    payload: Any
    expected: Any = None
    check: str = "eq"
    rel_tol: float = 0.0
    abs_tol: float = 0.0
    counted: bool = True  # False: setup (a definition, an import, an assignment), run but not scored
    group: int | None = None  # the asserts of one `check(f)` call share one: together they are one case


class _NotSimple(ValueError):
    """A statement outside the fast path's forms: the row's test code goes to the checker."""


def parse_tests(tests, *, unsafe_asserts: bool | None = None) -> list[Case]:
    """One row's `tests` (see the module docstring) as cases, in order. ValueError names the field.
    unsafe_asserts: deprecated and ignored (every form is judged safely now)."""
    if unsafe_asserts is not None:
        warnings.warn("unsafe_asserts is deprecated and ignored: test code of any form now runs in a checker "
                      "process, outside the sandbox", DeprecationWarning, stacklevel=2)  # fmt: skip
    if isinstance(tests, str) and tests.lstrip().startswith("{"):
        try:
            tests = json.loads(tests)
        except ValueError as e:
            raise ValueError(f"tests looks like JSON but is not: {e}") from e
    if isinstance(tests, Mapping):
        return _io_cases(tests)
    if isinstance(tests, str):
        try:
            trees = [ast.parse(tests)]
        except SyntaxError as e:
            raise ValueError(f"tests is not valid Python: {e.msg} (line {e.lineno})") from e
    elif isinstance(tests, Sequence) and all(isinstance(t, str) for t in tests):
        trees = []
        for i, text in enumerate(tests):
            try:
                trees.append(ast.parse(text))
            except SyntaxError as e:
                raise ValueError(f"tests[{i}] is not valid Python: {e.msg}") from e
    else:
        raise ValueError(f"tests must be a dict, a string or a list of strings, got {type(tests).__name__}")
    try:
        cases = [case for tree in trees for case in _source_cases(tree)]
    except _NotSimple:
        cases = []
    if cases:
        return cases
    units, modules = script.script_units(trees)  # no fast-path case: the checker says whether any runs
    if not units:
        return []  # no statement at all: the judge has nothing to run (`no_tests` where tests were given)
    return [Case("script", (source, tuple(modules), shown), counted=counted) for source, counted, shown in units]


def _io_cases(spec: Mapping) -> list[Case]:
    inputs, outputs = spec.get("inputs"), spec.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError("tests['inputs'] and tests['outputs'] must be lists of the same length")
    fn_name = spec.get("fn_name")
    if fn_name is None:
        if not all(isinstance(x, str) for x in inputs + outputs):
            raise ValueError("tests['inputs'] and tests['outputs'] must hold strings for stdin/stdout cases")
        return [Case("stdio", i, o) for i, o in zip(inputs, outputs)]
    if not isinstance(fn_name, str) or not re.fullmatch(r"[A-Za-z_]\w*", fn_name):
        raise ValueError(f"tests['fn_name'] must be a Python identifier, got {fn_name!r}")
    cases = []
    for k, (args, out) in enumerate(zip(inputs, outputs)):
        if not isinstance(args, list):
            raise ValueError(f"tests['inputs'][{k}] must be a list of arguments")
        _check_plain(args, f"tests['inputs'][{k}]")
        _check_plain(out, f"tests['outputs'][{k}]")
        cases.append(Case("call", (fn_name, list(args), {}), out))
    return cases


def _check_plain(value, field: str) -> None:
    try:
        values.encode(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field} is not a plain value: {e}") from e


def _source_cases(tree: ast.Module) -> list[Case]:
    """Top-level statements in order; HumanEval-style `def check(candidate): assert ...` followed
    by `check(f)` becomes the check's asserts with `candidate` replaced by `f`, and constant
    assignments (`METADATA = {...}`) are skipped."""
    templates, called, cases = {}, set(), []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _is_template(node):
            templates[node.name] = node
        elif (name := _template_call(node, templates)) is not None:
            called.add(name)
            template, fn = templates[name], node.value.args[0].id
            param = template.args.args[0].arg
            group = len(cases)  # grows with every call: each check has an assert
            cases += [dataclasses.replace(_statement_cases(_Rename(param, fn).visit(stmt))[0], group=group)
                      for stmt in _asserts(template)]  # fmt: skip
        elif not (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)
                  and _is_literal(node.value)):  # fmt: skip
            cases += _statement_cases(node)
    if set(templates) - called:
        raise _NotSimple("a check function called elsewhere, or never")  # the checker's parser says which
    return cases


def _is_template(node: ast.FunctionDef) -> bool:
    args = node.args
    return (len(args.args) == 1 and not (args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs)
            and not node.decorator_list and bool(_asserts(node))
            and all(isinstance(s, ast.Assert) or _is_docstring(s) for s in node.body))  # fmt: skip


def _asserts(node: ast.FunctionDef) -> list[ast.Assert]:
    return [s for s in node.body if isinstance(s, ast.Assert)]


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _template_call(node: ast.stmt, templates: dict) -> str | None:
    call = node.value if isinstance(node, ast.Expr) else None
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in templates
            and len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Name)):  # fmt: skip
        return call.func.id
    return None


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


class _Rename(ast.NodeTransformer):
    """`candidate(...)` -> `f(...)` in a copy of a check's assert."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit(self, node):
        return super().visit(copy.deepcopy(node)) if isinstance(node, ast.Assert) else super().visit(node)

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def _statement_cases(node: ast.stmt) -> list[Case]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return []
    if isinstance(node, ast.Assert):
        try:
            return [_assert_case(node.test)]
        except ValueError as e:
            raise _NotSimple(str(e)) from None
    raise _NotSimple("not an assert")


def _assert_case(test: ast.expr) -> Case:
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq)):
            call, lit = (left, right) if _is_call(left) else (right, left)
            return Case("call", _call(call), _literal(lit), "eq" if isinstance(op, ast.Eq) else "ne")
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (None, True, False):
            return Case("call", _call(left), right.value, "is")
        if isinstance(op, ast.In):
            options = _literal(right)
            if not isinstance(options, (list, tuple, set, frozenset)):
                raise ValueError("`in` needs a literal list, tuple or set")
            return Case("call", _call(left), list(options), "in")
        if isinstance(op, (ast.Lt, ast.LtE)) and _is_abs_diff(left):
            eps = _number(right)
            inner = left.args[0]
            return Case("call", _call(inner.left), _number(inner.right), "abs_lt" if isinstance(op, ast.Lt) else "abs_le",
                        abs_tol=eps)  # fmt: skip
    if isinstance(test, ast.Call) and ast.unparse(test.func) == "math.isclose" and len(test.args) == 2:
        call, lit = (test.args[0], test.args[1]) if _is_call(test.args[0]) else (test.args[1], test.args[0])
        tols = {k.arg: _number(k.value) for k in test.keywords}
        if not set(tols) <= {"rel_tol", "abs_tol"}:
            raise ValueError("math.isclose takes only rel_tol and abs_tol here")
        return Case("call", _call(call), _number(lit), "isclose", tols.get("rel_tol", 1e-9), tols.get("abs_tol", 0.0))
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Case("call", _call(test.operand), None, "falsy")
    if _is_call(test):
        return Case("call", _call(test), None, "truthy")
    raise ValueError("unsupported assert form")


def _is_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and _callee(node.func) is not None


def _callee(func: ast.expr) -> str | None:
    """`f` or `Solution().method` (LeetCode style) as the name the sandbox looks up."""
    if isinstance(func, ast.Name) and not hasattr(builtins, func.id):  # `max(...)`: the builtin unless the
        return func.id  # solution defines one, which only the checker process learns (at run time)
    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and not func.value.args
            and isinstance(func.value.func, ast.Name) and func.value.func.id == "Solution"):  # fmt: skip
        return func.attr
    return None


def _call(node: ast.expr) -> tuple[str, list, dict]:
    if not _is_call(node):
        raise ValueError("the tested expression must be a call of the solution's function")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise ValueError("*args/**kwargs are not supported")
    args = [_literal(a) for a in node.args]
    kwargs = {k.arg: _literal(k.value) for k in node.keywords}
    return _callee(node.func), args, kwargs


def _literal(node: ast.expr):
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"{ast.unparse(node)[:60]!r} is not a literal") from None
    _check_plain(value, "the literal")
    return value


def _number(node: ast.expr) -> float | int:
    value = _literal(node)
    if not values.is_number(value):
        raise ValueError(f"{ast.unparse(node)[:60]!r} is not a number")
    return value


def _is_abs_diff(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "abs"
            and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Sub)
            and _is_call(node.args[0].left))  # fmt: skip
