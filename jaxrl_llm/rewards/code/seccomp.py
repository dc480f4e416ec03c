"""A seccomp filter for the sandbox, compiled to classic BPF in pure Python (no libseccomp).

bubblewrap loads it (`--seccomp FD`) just before it starts the runner. It refuses (EPERM) the system
calls that escape the memory limit or widen the kernel surface, which namespaces and rlimits do not
cover: `memfd_create` (anonymous shared memory that RLIMIT_AS does not count until mapped), user
and other namespaces (a new user namespace could mount its own unbounded tmpfs), keyrings, BPF,
perf, userfaultfd, io_uring, ptrace and cross-process memory access, module and mount calls.
New processes are refused too (`fork`, `vfork`, `clone` without CLONE_THREAD): threads share one
address space, hence one RLIMIT_AS, but each process would have its own, multiplying the memory
limit. `clone3` answers ENOSYS so the C library falls back to `clone`, whose flags the filter reads;
any foreign architecture (32-bit or x32 system calls) is refused outright.
"""

from __future__ import annotations

import errno
import platform
import struct

# (audit arch, {name: number}) for the architectures we know the numbers of.
_ARCHES = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "memfd_create": 319, "memfd_secret": 447, "unshare": 272, "setns": 308, "clone": 56, "clone3": 435,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
        "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsmount": 432, "init_module": 175, "finit_module": 313, "kexec_load": 246,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "personality": 135, "fanotify_init": 300,
    }),
    "aarch64": (0xC00000B7, {
        "memfd_create": 279, "memfd_secret": 447, "unshare": 97, "setns": 268, "clone": 220, "clone3": 435,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
        "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsmount": 432, "init_module": 105, "finit_module": 273, "kexec_load": 104,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "personality": 92, "fanotify_init": 262,
    }),
}  # fmt: skip
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_ERRNO = 0x00050000
# Offsets in struct seccomp_data: nr, arch, then args[0] (its low 32 bits on little-endian).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def supported() -> bool:
    return platform.machine() in _ARCHES


def program() -> bytes:
    """The filter as packed `struct sock_filter` records, for bubblewrap's --seccomp."""
    arch, numbers = _ARCHES[platform.machine()]
    denied = sorted(v for k, v in numbers.items() if k not in ("clone", "clone3"))
    # The tail, where the checks jump to (relative jumps count from the next instruction).
    allow, clone_flags, enosys, eperm, kill = 0, 1, 5, 6, 7
    tail = [
        (_RET, 0, 0, _ALLOW),  # allow
        (_LD_W_ABS, 0, 0, _ARG0_LOW),  # clone_flags: look at clone's flags
        (_JSET, eperm - 2 - 1, 0, _CLONE_NAMESPACES),  # a new namespace: EPERM
        (_JSET, 0, eperm - 3 - 1, _CLONE_THREAD),  # a thread: on to ALLOW; a process (fork): EPERM
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),  # enosys: clone3, so the C library uses clone
        (_RET, 0, 0, _ERRNO | errno.EPERM),  # eperm
        (_RET, 0, 0, _KILL),  # kill: a foreign architecture
    ]
    checks = [(_JGE, _X32_BIT, eperm), (_JEQ, numbers["clone"], clone_flags), (_JEQ, numbers["clone3"], enosys)]
    checks += [(_JEQ, n, eperm) for n in denied]
    head = [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ, 0, len(checks) + 1 + kill, arch), (_LD_W_ABS, 0, 0, _NR)]
    tail_at = len(head) + len(checks)
    code = head + [(op, tail_at + target - (len(head) + i) - 1, 0, k) for i, (op, k, target) in enumerate(checks)]
    code += tail
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in code)
    return b"".join(struct.pack("<HBBI", op, jt, jf, k) for op, jt, jf, k in code)
