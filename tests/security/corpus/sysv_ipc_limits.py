# expect: runtime_error
# System V shared memory is charged to the worker's memory cgroup and outlives its creator: the
# execution's own IPC namespace caps it (16 MB a segment, 16 segments), and the program cannot
# raise the caps (/proc/sys is read-only) nor lower its OOM-killer priority below the worker's.
import ctypes
import os


def writes(path, text):
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, text.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    capped = libc.shmget(0, 64 << 20, 0o1600) < 0 and ctypes.get_errno() == 22  # EINVAL: past shmmax
    capped = capped and open("/proc/sys/kernel/shmmax").read().strip() == str(16 << 20)
    segments = [libc.shmget(0, 4096, 0o1600) for _ in range(32)]
    capped = capped and sum(s >= 0 for s in segments) <= 16
    capped = capped and not writes("/proc/sys/kernel/shmmax", str(1 << 40))
    capped = capped and open("/proc/self/oom_score_adj").read().strip() == "1000"
    capped = capped and not writes("/proc/self/oom_score_adj", "-1000")
    if capped:
        raise PermissionError("IPC capped, OOM priority kept")
    return x + 1
