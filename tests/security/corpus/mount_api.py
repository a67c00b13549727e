# expect: runtime_error
# The new mount API, chroot, pivot_root and umount: EPERM whatever the capabilities.
import ctypes


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    calls = [
        (430, b"tmpfs", 0),  # fsopen
        (428, -100, b"/tmp", 0),  # open_tree
        (161, b"/tmp"),  # chroot
        (155, b"/tmp", b"/tmp"),  # pivot_root
        (166, b"/proc", 2),  # umount2(MNT_DETACH)
        (246, 0, 0, None, 0),  # kexec_load
        (175, None, 0, b""),  # init_module
    ]
    for number, *args in calls:
        if libc.syscall(number, *args) >= 0 or ctypes.get_errno() != 1:
            return x + 1
    raise PermissionError("mounts and kernel loading denied")
