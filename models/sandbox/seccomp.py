"""A seccomp filter for model workers (issue 39), through libseccomp by ctypes.

libseccomp's own Python bindings are not on PyPI (they build with the C library's sources) and
the wrappers there are unmaintained; the five C functions used here are stable since
libseccomp 2.2. The filter allows every system call but those a model worker never needs and
an escaped one would use (each answers EPERM, so a library that probes one sees an ordinary
error): running programs, new sockets, tracing or reading other processes, signals to any
process but the worker itself, SysV IPC, new sessions or process groups, forks (threads stay
allowed: clone with CLONE_THREAD), namespaces, mounts, kernel keys, BPF, perf, module loading.
It applies to every thread of the worker (TSYNC) and is kept by anything the worker starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Any

ACT_ALLOW = 0x7FFF0000
ACT_ERRNO = 0x00050000
CMP_NE, CMP_MASKED_EQ = 1, 7
ATTR_TSYNC = 4
CLONE_THREAD = 0x00010000

DENIED = (
    # other programs
    "execve", "execveat",
    # networking: a worker talks to the server over the pipe it inherited only
    "socket", "socketpair",
    # other processes' memory and state
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "tkill",
    # System V IPC
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl",
    # escaping its process group, forking (threads use clone with CLONE_THREAD)
    "setsid", "setpgid", "fork", "vfork",
    # privileges, namespaces, the file system's shape
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "setns", "unshare", "mount", "umount2", "pivot_root", "chroot", "mknod", "mknodat",
    "open_by_handle_at", "name_to_handle_at",
    # the kernel itself
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "iopl", "ioperm",
)  # fmt: skip
# Signals: only to the worker's own process (arg 0 is the target pid / thread group)
OWN_PID_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")


class _Arg(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _library() -> Any:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Arg)
    ]  # fmt: skip
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def load_library() -> Any | None:
    """libseccomp, loaded before a worker's chroot (None when this system has none)."""
    try:
        return _library()
    except OSError:
        return None


def install(lib: Any | None) -> str:
    """Load the filter into this process (every thread); what holds, in words."""
    if lib is None:
        return "off: libseccomp is not installed"
    ctx = lib.seccomp_init(ACT_ALLOW)
    if not ctx:
        return "off: seccomp_init failed"
    try:
        deny = ACT_ERRNO | errno.EPERM
        rules = 0

        def add(name: str, *args: _Arg) -> None:
            nonlocal rules
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not on this architecture
                return
            array = (_Arg * len(args))(*args) if args else None
            if lib.seccomp_rule_add_array(ctx, deny, number, len(args), array) != 0:
                raise OSError(f"seccomp rule for {name} refused")
            rules += 1

        for name in DENIED:
            add(name)
        pid = os.getpid()
        for name in OWN_PID_ONLY:
            add(name, _Arg(0, CMP_NE, pid, 0))
        add("clone", _Arg(0, CMP_MASKED_EQ, CLONE_THREAD, 0))  # a fork, not a thread
        number = lib.seccomp_syscall_resolve_name(b"clone3")
        if number >= 0:  # its flags are in memory: ENOSYS, and glibc falls back to clone
            lib.seccomp_rule_add_array(ctx, ACT_ERRNO | errno.ENOSYS, number, 0, None)
        lib.seccomp_attr_set(ctx, ATTR_TSYNC, 1)
        if lib.seccomp_load(ctx) != 0:
            return f"off: seccomp_load failed (errno {ctypes.get_errno()})"
        what = "exec, sockets, ptrace, signals to others, IPC, forks"
        return f"on: {rules} system call rules ({what})"
    except OSError as exc:
        return f"off: {exc}"
    finally:
        lib.seccomp_release(ctx)
