"""Replies built to stall or crash the judge of the `code_tests` reward, each run beside an honest
sibling in the same batch: the judge's (parent's) wall time and peak memory, and both scores.

Each attack writes its reply straight to the reply pipe (its fd is the runner's last argument),
in place of the runner's answer, or returns a value no comparison can take. Run with another tree
first on the path to measure it ("before"):

    PYTHONPATH=<tree> python benchmarks/code_reward_attacks.py [--timeout 10] [--only NAME]

Each attack runs in a fresh process, so `ru_maxrss` is that attack's own peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

_WRITE = "import os, sys\ndef f():\n    os.write(int(sys.argv[2]), {payload})\n    return None\n"
_COLLIDING = "b'{{\"i\": 0, \"value\": {{\"{tag}\": [' + ','.join({item} for k in range(1, 30000)).encode() + b']}}}}\\n'"
_NESTED = "b'{\"i\": 0, \"value\": [' + b'[],' * ((40 << 20) // 3) + b'[]]}\\n'"
_HONEST_SET = "def f():\n    return {1, 2}\n"

# name: (attack code, honest code, tests); tests None: a run without tests (run_sandboxed alone).
ATTACKS = {
    "set of equal hashes (assert f() == {1, 2})": (
        _WRITE.format(payload=_COLLIDING.format(tag="set", item="str(k * (2**61 - 1))")), _HONEST_SET,
        ["assert f() == {1, 2}"]),
    "dict keys of equal hashes (assert f() == {1: 2})": (
        _WRITE.format(payload=_COLLIDING.format(tag="dict", item="'[%d, 0]' % (k * (2**61 - 1))")),
        "def f():\n    return {1: 2}\n", ["assert f() == {1: 2}"]),
    "set of equal hashes (checker: len(f()) == 2 and ...)": (
        _WRITE.format(payload=_COLLIDING.format(tag="set", item="str(k * (2**61 - 1))")), _HONEST_SET,
        ["assert len(f()) == 2 and f() == {1, 2}"]),
    "40 MiB nested lists (assert f() != [1])": (_WRITE.format(payload=_NESTED), "def f():\n    return [2]\n",
                                                 ["assert f() != [1]"]),
    "40 MiB nested lists (checker: x = f(); assert x != [1])": (
        _WRITE.format(payload=_NESTED), "def f():\n    return [2]\n", ["x = f()\nassert x != [1]"]),
    "40 MiB nested lists (a run without tests)": (
        "import os, sys\nos.write(int(sys.argv[2]), " + _NESTED + ")\n", "print('hello')\n", None),
    "10**400 (assert abs(f() - 0.5) < 1e-6)": ("def f():\n    return 10**400\n", "def f():\n    return 0.5\n",
                                              ["assert abs(f() - 0.5) < 1e-6"]),
    "10**400 (assert math.isclose(f(), 0.5))": ("def f():\n    return 10**400\n", "def f():\n    return 0.5\n",
                                               ["import math", "assert math.isclose(f(), 0.5)"]),
    "10**400 (checker: abs(f() * 1 - 0.5) < 1e-6)": ("def f():\n    return 10**400\n",
                                                     "def f():\n    return 0.5\n", ["assert abs(f() * 1 - 0.5) < 1e-6"]),
}  # fmt: skip


def run_attack(name: str, timeout: float) -> tuple[float | None, float | None, str]:
    """(attack score, honest sibling score, how it ended), both judged in one batch."""
    from concurrent.futures import ThreadPoolExecutor

    from jaxrl_llm.rewards.code import run_code_tests, run_sandboxed

    attack, honest, tests = ATTACKS[name]
    try:
        if tests is None:
            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(lambda code: run_sandboxed(code, timeout=timeout), [attack, honest]))
        else:
            results = run_code_tests([attack, honest], [tests, tests], max_workers=2, timeout=timeout)
    except Exception as e:  # the judge itself failed: the whole batch is lost
        return None, None, f"raised {type(e).__name__}: {str(e)[:60]}"
    return results[0].score, results[1].score, f"{results[0].status}: {results[0].reason[:60]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--limit", type=float, default=200.0, help="give up on one attack after this many seconds")
    parser.add_argument("--only", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        start = time.monotonic()
        attack, sibling, how = run_attack(args.child, args.timeout)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps([attack, sibling, how, time.monotonic() - start, rss]))
        return
    print(f"timeout {args.timeout:g} s per completion, 2 workers; parent = the judge's process")
    print(f"{'attack':58} {'wall s':>7} {'peak MiB':>9} {'attack':>7} {'sibling':>8}  ended as")
    for name in ATTACKS:
        if args.only and args.only not in name:
            continue
        try:
            proc = subprocess.run([sys.executable, __file__, "--timeout", str(args.timeout), "--child", name],
                                  capture_output=True, text=True, timeout=args.limit)  # fmt: skip
            attack, sibling, how, wall, rss = json.loads(proc.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            print(f"{name:58} {'>' + format(args.limit, 'g'):>7}")
            continue
        except (ValueError, IndexError):
            print(f"{name:58} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{name:58} {wall:7.1f} {rss:9.0f} {attack!s:>7} {sibling!s:>8}  {how}")


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
