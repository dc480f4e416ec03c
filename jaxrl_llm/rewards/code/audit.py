"""The audit hook installed in the sandbox before the solution runs (source text, run there).

With bubblewrap it is a second layer; without it (`sandbox_layers()` lacks `bwrap`), it is the main
one. It cannot make results trustworthy (the solution shares its interpreter and can switch it off
with enough introspection) and does not need to: the judge compares values outside the sandbox.
It refuses what an honest solution never does, and any refusal scores the completion 0.
"""

# The audit events refused outright, by exact name or prefix.
BLOCKED_EVENTS = (
    "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "resource.setrlimit",
    "resource.prlimit", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
    "webbrowser.open", "urllib.Request", "sqlite3.enable_load_extension", "sqlite3.load_extension",
)  # fmt: skip
BLOCKED_PREFIXES = ("socket.", "subprocess.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn")
# Modules that call C code touching files or memory without audit events (or load libraries);
# `posix` is imported at start-up, so only a re-import (to restore mknod) reaches the hook.
BLOCKED_IMPORTS = ("ctypes", "_ctypes", "_multiprocessing", "_posixshmem", "readline", "posix", "_dbm", "_gdbm",
                   "cffi", "_cffi_backend")  # fmt: skip
# Events with paths that must stay inside the work dir: (path argument, its dir_fd argument or
# None) by position, as CPython 3.11 raises them (a dir_fd of -1 or None means the cwd).
PATH_EVENTS = {
    "os.remove": [(0, 1)], "os.rmdir": [(0, 1)], "os.mkdir": [(0, 2)], "os.chmod": [(0, 2)],
    "os.chown": [(0, 3)], "os.utime": [(0, 3)], "os.symlink": [(1, 2)], "os.rename": [(0, 2), (1, 3)],
    "os.link": [(0, 2), (1, 3)], "os.truncate": [(0, None)], "os.chflags": [(0, None)],
    "os.setxattr": [(0, None)], "os.removexattr": [(0, None)], "shutil.rmtree": [(0, 1)],
    "shutil.chown": [(0, None)], "shutil.copyfile": [(1, None)], "shutil.copytree": [(1, None)],
    "shutil.move": [(1, None)], "tempfile.mkdtemp": [(0, None)], "tempfile.mkstemp": [(0, None)],
    "sqlite3.connect": [(0, None)],
}  # fmt: skip


# Refusals the hook reports, at most: the judge takes more as forged (the score is 0 already).
MAX_REPORTS = 5


def config() -> dict:
    return {"blocked_events": BLOCKED_EVENTS, "blocked_prefixes": BLOCKED_PREFIXES,
            "blocked_imports": BLOCKED_IMPORTS, "path_events": PATH_EVENTS, "max_reports": MAX_REPORTS}  # fmt: skip


# `install_audit_hook(cfg, work, private, report)`: `report(text)` sends one refusal to the judge.
SOURCE = r'''
def install_audit_hook(cfg, work, private, report):
    import os, sys
    state = {"blocked": 0, "busy": False}
    blocked_prefixes = tuple(cfg["blocked_prefixes"])
    blocked_events = frozenset(cfg["blocked_events"])
    blocked_imports = frozenset(cfg["blocked_imports"])
    path_events = cfg["path_events"]
    write_ok = frozenset(("/dev/null", "/dev/stdout", "/dev/stderr"))
    write_mask = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    realpath, isdir, join, sep, fsdecode, readlink = (os.path.realpath, os.path.isdir, os.path.join, os.sep,
                                                      os.fsdecode, os.readlink)

    def within(resolved):
        return resolved == work or resolved.startswith(work + sep)

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return True  # an fd was opened through a checked open already
        path = fsdecode(path)
        if dir_fd is not None and dir_fd >= 0 and not path.startswith(sep):
            path = join(readlink("/proc/self/fd/%d" % dir_fd), path)
        return within(realpath(path))

    def check(event, args):
        if event in blocked_events or event.startswith(blocked_prefixes):
            return repr(args[0])[:120] if args else ""
        if event == "import" and args[0].partition(".")[0] in blocked_imports:
            return "import " + args[0]
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return None
            text = fsdecode(path)
            resolved = realpath(text)
            writes = (isinstance(flags, int) and flags & write_mask) or (
                isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writes:
                return None if text in write_ok or within(resolved) else "write " + text
            if resolved.startswith("/proc/") and not resolved.startswith(("/proc/self/", "/proc/%d/" % os.getpid())):
                return "read " + text  # other processes' command lines, environments, fds
            if private and resolved.startswith(private) and not within(resolved):
                return "read " + text  # the judge's own files
            if isdir(resolved) and not within(resolved):
                return "open directory " + text  # an fd usable as dir_fd outside the work dir
            return None
        if event in path_events:
            bad = [args[i] for i, fd_index in path_events[event]
                   if args[i] is not None and not inside(args[i], None if fd_index is None else args[fd_index])]
            return "%s outside the work dir" % fsdecode(bad[0]) if bad else None
        return None

    def hook(event, args):
        if state["busy"]:
            return  # our own os.readlink/realpath calls
        state["busy"] = True
        try:
            detail = check(event, args)
        except Exception as error:  # a path we cannot resolve is a path we do not allow
            detail = "unresolvable: " + type(error).__name__
        finally:
            state["busy"] = False
        if detail is None:
            return
        state["blocked"] += 1
        if state["blocked"] <= cfg["max_reports"]:
            report("%s: %s" % (event, detail[:200]))
        if event == "import":  # ImportError, so `try: import readline except ImportError` still works
            raise ImportError("sandbox: %s is not allowed" % detail[:100])
        raise PermissionError("sandbox: %s is not allowed (%s)" % (event, detail[:100]))

    sys.addaudithook(hook)
    import posix
    # They create files, or anonymous shared memory, without raising any audit event.
    for name in ("mknod", "mkfifo", "memfd_create"):
        os.__dict__.pop(name, None)
        posix.__dict__.pop(name, None)
'''
