"""The model workers' system call filter (models/sandbox/seccomp.py), loaded in a forked child:
what a worker that runs code would try fails with EPERM (running a program, a socket, a signal
to another process, a fork, a new session, SysV IPC, tracing), while what a model needs (threads,
torch, numpy) still works; and a real worker reports the filter on in its sandbox state."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest

from models.sandbox import seccomp

pytestmark = pytest.mark.skipif(seccomp.load_library() is None, reason="no libseccomp")


def _attempts(conn: Connection) -> None:
    out: dict[str, Any] = {"state": seccomp.install(seccomp.load_library())}

    def attempt(name: str, fn: Callable[[], object]) -> None:
        try:
            fn()
            out[name] = "allowed"
        except OSError as exc:
            out[name] = exc.errno

    libc = ctypes.CDLL(None, use_errno=True)

    def shmget() -> None:
        if libc.shmget(0, 4096, 0o1666) < 0:  # IPC_PRIVATE, IPC_CREAT | 0666
            raise OSError(ctypes.get_errno(), "shmget")

    def ptrace() -> None:
        if libc.ptrace(16, os.getppid(), 0, 0) < 0:  # PTRACE_ATTACH to the parent
            raise OSError(ctypes.get_errno(), "ptrace")

    attempt("execv", lambda: os.execv("/bin/true", ["true"]))
    attempt("socket", socket.socket)
    attempt("signal another process", lambda: os.kill(os.getppid(), 0))
    attempt("fork", os.fork)
    attempt("setsid", os.setsid)
    attempt("shmget", shmget)
    attempt("ptrace", ptrace)
    attempt("signal itself", lambda: os.kill(os.getpid(), 0))
    box: list[int] = []
    thread = threading.Thread(target=lambda: box.append(1))
    thread.start()
    thread.join()
    out["thread"] = box == [1]
    import torch

    out["torch"] = float(torch.nn.Linear(3, 2)(torch.ones(4, 3)).shape[0])
    conn.send(out)


def test_the_filter_refuses_an_escape_and_keeps_what_models_need() -> None:
    parent, child = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=_attempts, args=(child,))
    process.start()
    out = parent.recv()
    process.join(10)
    assert out["state"].startswith("on:"), out["state"]
    for name in ("execv", "socket", "signal another process", "fork", "setsid", "shmget", "ptrace"):
        assert out[name] == 1, (name, out[name])  # EPERM
    assert out["signal itself"] == "allowed" and out["thread"] is True and out["torch"] == 4.0
    assert process.exitcode == 0
