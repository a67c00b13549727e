# expect: runtime_error
# ptrace(PTRACE_TRACEME), process_vm_readv of its own memory and userfaultfd(UFFD_USER_MODE_ONLY)
# all work for any process without the filter; with it each is EPERM.
import ctypes


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    source, target = ctypes.create_string_buffer(b"abc"), ctypes.create_string_buffer(3)
    local = IoVec(ctypes.cast(target, ctypes.c_void_p), 3)
    remote = IoVec(ctypes.cast(source, ctypes.c_void_p), 3)
    denied = [libc.syscall(101, 0, 0, 0, 0) < 0 and ctypes.get_errno() == 1]  # ptrace(TRACEME)
    pid = libc.getpid()
    read = libc.syscall(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # process_vm_readv
    denied.append(read < 0 and ctypes.get_errno() == 1)
    denied.append(libc.syscall(323, 1) < 0 and ctypes.get_errno() == 1)  # userfaultfd(USER_MODE_ONLY)
    denied.append(libc.syscall(298, None, 0, -1, -1, 0) < 0 and ctypes.get_errno() == 1)  # perf_event_open
    denied.append(libc.syscall(321, 0, None, 0) < 0 and ctypes.get_errno() == 1)  # bpf
    if all(denied):
        raise PermissionError("process memory, perf and bpf denied")
    return x + 1
