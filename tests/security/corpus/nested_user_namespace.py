# expect: runtime_error
# A nested user namespace would hand the program every capability inside it (CAP_NET_ADMIN,
# CAP_SYS_ADMIN over new mounts): unshare, setns and clone with namespace flags are EPERM, and
# clone3 (whose flags a filter cannot read) is ENOSYS so the C library falls back to clone.
import ctypes
import os

CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    denied = [libc.unshare(CLONE_NEWUSER) < 0 and ctypes.get_errno() == 1]
    denied.append(libc.unshare(CLONE_NEWNET) < 0 and ctypes.get_errno() == 1)
    denied.append(libc.syscall(308, -1, 0) < 0 and ctypes.get_errno() == 1)  # setns: EPERM, not EBADF
    child = libc.syscall(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)  # raw clone
    if child == 0:
        os._exit(0)
    denied.append(child < 0 and ctypes.get_errno() == 1)
    args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, SIGCHLD)
    denied.append(libc.syscall(435, args, 88) < 0 and ctypes.get_errno() == 38)  # clone3: ENOSYS
    denied.append(os.fork() >= 0)  # plain fork still works (and the child just returns here)
    if all(denied):
        raise PermissionError("namespaces denied")
    return x + 1
