# expect: runtime_error
# Raw syscalls through ctypes: setuid(0), then unshare a user namespace and mount over /usr.
import ctypes


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(105, 0) == 0:  # SYS_setuid
        return x + 1
    if libc.unshare(0x10000000 | 0x00020000) == 0 and libc.mount(b"tmpfs", b"/usr", b"tmpfs", 0, None) == 0:
        open("/usr/evil", "w").write("only in my own namespace")
    raise PermissionError(f"setuid failed, errno {ctypes.get_errno()}")
