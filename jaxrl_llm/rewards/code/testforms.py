"""The test runners of the checker process (source text, run there; `checker` appends it).

`run_function(namespace, name)` runs one pytest-style test function, `run_method(namespace, cls,
name)` one test method: of a `unittest.TestCase` through unittest itself (setUp/tearDown,
setUpClass/tearDownClass and setUpModule around each method, subTest), of a pytest-style class with
its `setup_method`/`teardown_method`. A test raises when it fails; a skipped one returns.

The checker has the standard library only, so `pytest` is a stand-in module (`make_pytest`):
`raises` (context manager or call form, `match=`), `approx` (numbers and lists, tuples, dicts of
them: pytest's default tolerances), `mark.parametrize` (every parameter set runs inside the one case;
stacked marks multiply), `mark.skip`/`skipif` (the test is no case), other marks (ignored),
`fixture` (fixtures the test code defines, with fixtures as their own arguments, generator teardown
included), `skip()`, `fail()`, `main()` (nothing). A fixture pytest itself provides (`tmp_path`,
`capsys`, `monkeypatch`) is not available: the test fails, naming it.
"""

SOURCE = r'''
class Skipped(Exception):
    """A skipped test: no case."""


class Failed(AssertionError):
    pass


def make_pytest():
    import re, sys

    pytest = type(sys)("pytest")

    class RaisesContext:
        def __init__(self, expected, match):
            self.expected, self.match, self.value, self.type = expected, match, None, None

        def __enter__(self):
            return self

        def __exit__(self, kind, value, trace):
            if kind is None:
                raise Failed("DID NOT RAISE %s" % getattr(self.expected, "__name__", self.expected))
            if not issubclass(kind, self.expected):
                return False
            if self.match is not None and not re.search(self.match, str(value)):
                raise Failed("the message %r does not match %r" % (str(value)[:100], self.match))
            self.value, self.type = value, kind
            return True

    def raises(expected, *args, match=None, **kwargs):
        context = RaisesContext(expected, match)
        if args:
            with context:
                args[0](*args[1:], **kwargs)
        return context

    class Approx:
        __hash__ = None

        def __init__(self, expected, rel=None, abs=None):
            self.expected, self.rel, self.abs = expected, rel, abs

        def tolerance(self, expected):
            absolute = 1e-12 if self.abs is None else self.abs
            if self.rel is None and self.abs is not None:
                return absolute
            return max((1e-6 if self.rel is None else self.rel) * abs(expected), absolute)

        def close(self, expected, got):
            number = lambda x: type(x) in (int, float, bool)
            if type(expected) in (list, tuple):
                return type(got) in (list, tuple) and len(got) == len(expected) and all(
                    self.close(e, g) for e, g in zip(expected, got))
            if type(expected) is dict:
                return type(got) is dict and got.keys() == expected.keys() and all(
                    self.close(v, got[k]) for k, v in expected.items())
            if number(expected) and number(got):
                return expected == got or abs(expected - got) <= self.tolerance(expected)
            return expected == got

        def __eq__(self, other):
            return self.close(self.expected, other)

        def __repr__(self):
            return "approx(%r)" % (self.expected,)

    def parametrize(names, rows, **options):
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = [dict(zip(names, row if len(names) > 1 else (row,))) for row in rows]

        def mark(fn):
            fn.__dict__.setdefault("judge_params", []).append(rows)
            return fn
        return mark

    def skip_mark(condition=True, *args, reason="", **options):
        if callable(condition) and not args:  # @pytest.mark.skip without arguments
            condition.judge_skip = True
            return condition

        def mark(fn):
            fn.judge_skip = bool(condition)
            return fn
        return mark

    marks = {"parametrize": parametrize, "skip": skip_mark, "skipif": skip_mark}

    class Mark:

        def __getattr__(self, name):  # any other mark: ignored, with or without arguments
            if name in marks:
                return marks[name]
            return lambda *a, **k: a[0] if len(a) == 1 and callable(a[0]) and not k else (lambda fn: fn)

    def fixture(fn=None, **options):
        if fn is None:
            return lambda f: fixture(f)
        fn.judge_fixture = True
        return fn

    def skip(reason=""):
        raise Skipped(reason)

    def fail(reason=""):
        raise Failed(reason)

    pytest.__dict__.update(raises=raises, approx=Approx, mark=Mark(), fixture=fixture, skip=skip, fail=fail,
                           main=lambda *a, **k: 0, fixtures=None)
    return pytest


def arguments(fn, skip_self):
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    return names[1:] if skip_self else names


def call_test(fn, namespace, skip_self=False):
    """Calls `fn` once per parameter set, its other arguments the test code's fixtures."""
    if getattr(fn, "judge_skip", False):
        raise Skipped("marked skip")
    sets = [{}]
    for rows in getattr(fn, "judge_params", []):
        sets = [dict(s, **row) for row in rows for s in sets]
    for params in sets:
        finish = []
        try:
            kwargs = dict(params)
            for name in arguments(fn, skip_self):
                if name not in kwargs:
                    kwargs[name] = fixture_value(name, namespace, finish, 0)
            fn(**kwargs)
        finally:
            for generator in reversed(finish):
                for _ in generator:  # the fixture's teardown
                    pass


def fixture_value(name, namespace, finish, depth):
    fixture = namespace.get(name)
    if not getattr(fixture, "judge_fixture", False) or depth > 16:
        raise Failed("the pytest fixture %r is not available (only fixtures the test code defines)" % name)
    kwargs = {n: fixture_value(n, namespace, finish, depth + 1) for n in arguments(fixture, False)}
    value = fixture(**kwargs)
    if type(value).__name__ == "generator":
        finish.append(value)
        value = next(value)
    return value


def run_function(namespace, name):
    try:
        call_test(namespace[name], namespace)
    except Skipped:
        pass


def run_method(namespace, cls_name, name):
    import sys
    cls = namespace[cls_name]
    unittest = sys.modules.get("unittest")
    if unittest is not None and isinstance(cls, type) and issubclass(cls, unittest.TestCase):
        result = unittest.TestResult()
        unittest.TestSuite([cls(name)]).run(result)
        problems = result.errors + result.failures
        if problems:
            lines = [line for line in problems[0][1].strip().splitlines() if line.strip()]
            raise Failed(lines[-1].strip()[:200] if lines else "failed")
        if result.unexpectedSuccesses:
            raise Failed("unexpected success")
        return
    try:
        instance = cls()
        for hook in ("setup_method", "teardown_method"):
            if not hasattr(instance, hook):
                setattr(instance, hook, lambda *a: None)
        instance.setup_method(getattr(instance, name))
        try:
            call_test(getattr(instance, name), namespace, skip_self=True)
        finally:
            instance.teardown_method(getattr(instance, name))
    except Skipped:
        pass
'''
