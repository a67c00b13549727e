# expect: runtime_error
# Appends to /etc/passwd and remounts / read-write (as bwrap run as real root would allow).
import ctypes


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None, b"/", None, 32 | 4096, None) == 0:  # MS_REMOUNT | MS_BIND, read-write
        return x + 1
    open("/etc/passwd", "a").write("evil::0:0::/:/bin/sh\n")
    return x + 1
