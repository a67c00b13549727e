# expect: runtime_error
# PTRACE_ATTACH to the judge to rewrite its verdict.
import ctypes
import os


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, os.getppid(), None, None) == 0:  # PTRACE_ATTACH
        return x + 1
    raise PermissionError(f"ptrace failed, errno {ctypes.get_errno()}")
