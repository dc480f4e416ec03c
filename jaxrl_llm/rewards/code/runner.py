"""The program that runs inside the sandbox: `python -I -S -B -c SOURCE REQUEST_FD REPLY_FD [CALLS_FD ANSWERS_FD]`.

It is trusted only until the solution starts. Before that it reads its configuration (the first
message on the request pipe), applies the rlimits, drops to the sandbox's own uid when started as root
and installs the audit hook. Then it answers one request at a time (a 4-byte length and a
`marshal` dump: the judge is its only writer) with one JSON reply line:

  {"i": k, "call": (name, args, kwargs)} -> {"i": k, "value": <values.encode(result)>}
  {"i": k, "wire": (name, args, kwargs)} -> the same, the arguments in wire form (a checker's proxy
                                            call; kwargs None: none), plus "changed": the arguments
                                            changed in place
  {"i": k, "stdin": text}                -> {"i": k, "stdout": text}   (program re-run, fresh globals)
  any failure                            -> {"i": k, "error": "TypeName: first line"}

and `{"blocked": "..."}` whenever the audit hook refuses something. With CALLS_FD and ANSWERS_FD
(test code run by a checker process, `checker`), once the ready message is sent those two pipes
take the place of the judge's pair (dup2 onto the same numbers: every later request comes from the
checker, every later reply line and refusal goes to it). Requests carry inputs only: the
expected outputs never enter the sandbox, so nothing here can be forged into a pass. Its own stdout
and stderr are pipes the judge drains (capped there); a stdin/stdout run's output goes to a file in
the work dir (the sandbox's tmpfs), under RLIMIT_FSIZE. Python runs without `site`, so `exit` and
`quit` are defined here.
"""

import inspect

from jaxrl_llm.rewards.code import audit, values

_MAIN = r'''
import _thread, builtins, marshal, os, resource, sys

# JSON out without the json module, whose import (re, enum, ...) would double the start-up time.
# Only what `encode` produces reaches it: None, bool, int, finite float, str, list, str-keyed dict.
_ESCAPES = {c: "\\u%04x" % c for c in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})

def dump(value):
    kind = type(value)
    if value is None or kind is bool:
        return "null" if value is None else "true" if value else "false"
    if kind is int or kind is float:
        return repr(value) if kind is float else str(value)
    if kind is str:
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return '"' + value + '"'  # nothing to escape (str.translate costs microseconds even here)
        return '"' + value.translate(_ESCAPES) + '"'
    if kind is list:
        return "[" + ",".join(map(dump, value)) + "]"
    return "{" + ",".join(dump(k) + ":" + dump(v) for k, v in value.items()) + "}"

def read_message(fd):
    # One request: a 4-byte length, then a marshal dump. marshal is safe here: only the judge, then
    # its checker process (both trusted), write it.
    header = read_exact(fd, 4)
    return None if header is None else marshal.loads(read_exact(fd, int.from_bytes(header, "little")))

def read_exact(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)

def renumber_low(fd):
    """`fd` moved to the lowest free descriptor number (under any RLIMIT_NOFILE set later)."""
    low = os.dup(fd)
    os.close(fd)
    return low


def main():
    # The judge's numbers for these may lie past RLIMIT_NOFILE (set below: a busy trainer has hundreds of
    # descriptors open), and the checker's handover dup2s onto them: renumbered low first, or dup2 fails.
    request_fd, reply_fd = (renumber_low(int(fd)) for fd in sys.argv[1:3])
    sys.argv[1:3] = str(request_fd), str(reply_fd)  # no secret: a solution can find its descriptors anyway

    lock = _thread.allocate_lock()  # a line at a time, whichever thread the audit hook reports from

    def reply(record, handover=()):
        data = (dump(record) + "\n").encode("utf-8", "replace")
        with lock:
            while data:
                data = data[os.write(reply_fd, data):]
            for fd, new in handover:  # under the lock: each refusal goes either before this line or after it
                os.dup2(new, fd)
                os.close(new)

    cfg = read_message(request_fd)
    work = cfg["workdir"]
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if cfg["reroute_paths"]:
            reroute_imports()
        for name, soft, hard in cfg["rlimits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if cfg["drop_to"] is not None:
            drop_privileges(*cfg["drop_to"])
        os.umask(0o077)
        os.chdir(work)
    except BaseException as error:  # never run the solution in a half-built sandbox
        reply({"fatal": describe(error)})
        return
    builtins.exit = builtins.quit = exit_program  # what the site module (-S: not loaded) would define
    if cfg["audit"] is not None:
        install_audit_hook(cfg["audit"], os.path.realpath(work), cfg["private"], lambda d: reply({"blocked": d}))
    try:
        program = compile(cfg["code"], "<solution>", "exec")
    except BaseException as error:
        reply({"ready": False, "error": describe(error)})
        return
    module = type(sys)("solution")  # a module (dataclasses look it up in sys.modules), no import
    namespace = module.__dict__
    if cfg["load_module"]:
        sys.modules["solution"] = module
        error = run_program(program, namespace)
        if error is not None:
            reply({"ready": False, "error": error})
            return
    # A checker's calls: its own pipe pair, in place of the judge's (one dup2 each), after this line.
    handover = ((request_fd, int(sys.argv[3])), (reply_fd, int(sys.argv[4]))) if len(sys.argv) > 4 else ()
    reply({"ready": True, "names": solution_names(namespace)}, handover)
    handlers = {"call": lambda p: call(namespace, *p), "stdin": lambda p: stdio(program, p, work, cfg),
                "wire": lambda p: call(namespace, p[0], decode(p[1]), {} if p[2] is None else decode(p[2]), True)}
    while True:
        request = read_message(request_fd)
        if request is None:
            return
        (kind, payload), = [(k, v) for k, v in request.items() if k != "i"]
        try:
            record = handlers[kind](payload)
        except BaseException as error:
            record = {"error": describe(error)}
        record["i"] = request["i"]
        reply(record)

def describe(error):
    try:
        text = str(error).strip().splitlines()
    except BaseException:
        text = []
    return type(error).__name__ + (": " + text[0][:200] if text else "")

def exit_program(code=None):
    """exit() / quit(): end the program as sys.exit does (status None or 0: a normal end)."""
    raise SystemExit(code)

def run_program(program, namespace):
    """None if the program ran (or ended with exit(), exit(0), sys.exit(False)), else its error: a
    SystemExit with any other status is a failure, as a non-zero exit status would be."""
    try:
        exec(program, namespace)
    except SystemExit as error:
        if error.code not in (None, 0):
            return "SystemExit: %r" % (error.code,)
    except BaseException as error:
        return describe(error)
    return None

def solution_names(namespace):
    """The solution's top-level callables (functions, classes, imported ones): the names the test
    code's free names resolve to. Dunder names never: `__import__` would reach the test code's imports."""
    names = [n for n, v in list(namespace.items())[:4096] if type(n) is str and n.isidentifier()
             and not n.startswith("__") and len(n) <= 100 and callable(v)]
    return names[:1024]

def call(namespace, name, args, kwargs, track=False):
    """The solution's `name(*args, **kwargs)`; with `track`, also the mutable containers among the
    arguments (list, dict, set, bytearray, collections') that the call changed in place, as
    [position or keyword, value after]."""
    fn = namespace.get(name)
    if fn is None and isinstance(namespace.get("Solution"), type):
        fn = getattr(namespace["Solution"](), name, None)
    if not callable(fn):
        raise NameError("the solution defines no function %r" % name)
    mutable = [(k, v) for k, v in list(enumerate(args)) + list(kwargs.items())
               if isinstance(v, (list, dict, set, bytearray)) or type(v).__name__ == "deque"]
    before = [encode(v) for _, v in mutable] if track else []
    result = fn(*args, **kwargs)
    record = {"value": encode(result)}
    if before:
        after = [encode(v) for _, v in mutable]
        record["changed"] = [[k, a] for (k, _), b, a in zip(mutable, before, after) if a != b]
    return record

def scratch(work, data):
    try:
        fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):
        path = os.path.join(work, ".io%d" % os.getpid())
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(path)
    os.write(fd, data)
    os.lseek(fd, 0, 0)
    return fd

def stdio(program, text, work, cfg):
    """Runs the program as __main__ with `text` on fd 0 and fd 1 captured (open(0), sys.stdin,
    input() and print all work); returns what it wrote."""
    for fd, data in ((0, text.encode("utf-8")), (1, b"")):
        tmp = scratch(work, data)
        if tmp != fd:  # the program may have closed fd 0 or 1 (open(0) without closefd=False)
            os.dup2(tmp, fd)
            os.close(tmp)
    sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    out = sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    error = run_program(program, {"__name__": "__main__", "__builtins__": builtins})
    try:
        out.flush()
    except BaseException as flush_error:
        error = error or describe(flush_error)
    if error is not None:
        return {"error": error}
    os.lseek(1, 0, 0)
    data = os.read(1, cfg["max_output"] + 1)
    return {"stdout": data.decode("utf-8", "replace")}

def drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if 0 in (os.getuid(), os.geteuid(), os.getgid(), os.getegid()):
        raise RuntimeError("could not drop root privileges")
    with open("/proc/self/status") as f:
        caps = [line.split()[1] for line in f if line.startswith(("CapEff:", "CapPrm:"))]
    if any(int(c, 16) for c in caps):
        raise RuntimeError("capabilities survived the uid drop")

def reroute_imports():
    """Without bubblewrap the stdlib may sit under a directory the sandbox uid cannot enter (/root
    is 0700): keep importing through directory fds opened now, as /proc/self/fd/N."""
    moved = {}
    for p in sys.path:
        try:
            moved[p] = "/proc/self/fd/%d" % os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            pass

    def move(entry):
        for old, new in moved.items():
            if entry == old or entry.startswith(old + os.sep):
                return new + entry[len(old):]
        return entry

    sys.path[:] = list(moved.values())
    for mod in list(sys.modules.values()):  # packages imported at start-up, e.g. collections
        if isinstance(getattr(mod, "__path__", None), list):
            mod.__path__[:] = [move(e) for e in mod.__path__]
    sys.path_importer_cache.clear()

try:
    main()
finally:
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os._exit(0)
'''

# The wire format's two directions (values.py), builtins only: the `_TYPES = ...` line is taken as written.
_TYPES_LINE = next(line for line in inspect.getsource(values).splitlines() if line.startswith("_TYPES = "))
SOURCE = "\n".join([inspect.getsource(values.encode), inspect.getsource(values.decode),
                    inspect.getsource(values._pairs), _TYPES_LINE, audit.SOURCE, _MAIN])
