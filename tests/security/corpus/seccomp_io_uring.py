# expect: runtime_error
# io_uring_setup (unprivileged on this kernel, a rich source of kernel bugs): the seccomp filter
# answers EPERM. Any other outcome returns the right answer, which the corpus counts as a failure.
import ctypes


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    if libc.syscall(425, 8, params) < 0 and ctypes.get_errno() == 1:  # io_uring_setup: EPERM
        raise PermissionError("io_uring denied")
    return x + 1
