# expect: runtime_error
# The kernel keyrings (add_key, keyctl, request_key) are open to any uid without the filter.
import ctypes


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    denied = []
    key = libc.syscall(248, b"user", b"cascade", b"secret", 6, -2)  # add_key(..., KEY_SPEC_PROCESS_KEYRING)
    denied.append(key < 0 and ctypes.get_errno() == 1)
    denied.append(libc.syscall(250, 0, -1, 0) < 0 and ctypes.get_errno() == 1)  # keyctl(GET_KEYRING_ID)
    denied.append(libc.syscall(249, b"user", b"cascade", None, 0) < 0 and ctypes.get_errno() == 1)
    if all(denied):
        raise PermissionError("keyrings denied")
    return x + 1
