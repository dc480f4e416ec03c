"""Wrong solutions the code-reward benchmarks build from a correct one."""

# Appended to a correct solution: its entry point `{e}` returns a value one step off (bool negated, number
# + 1, string + "a", sequence one shorter, None -> 1, anything else -> None).
OFF_BY_ONE = '''
_judge_original = {e}
def {e}(*args, **kwargs):
    return _judge_off(_judge_original(*args, **kwargs))
def _judge_off(r):
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "a"
    if isinstance(r, (list, tuple)):
        return r[:-1] if r else type(r)([1])
    return 1 if r is None else None
'''
