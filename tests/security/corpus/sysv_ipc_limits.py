# expect: runtime_error
# System V shared memory is charged to the worker's memory cgroup and outlives its creator: the
# execution's own IPC namespace caps it (16 MB a segment, 16 segments), and the program cannot
# raise the caps (/proc/sys is read-only) nor lower its own OOM-killer priority.
import ctypes


def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    capped = libc.shmget(0, 64 << 20, 0o1600) < 0 and ctypes.get_errno() == 22  # EINVAL: past shmmax
    capped = capped and open("/proc/sys/kernel/shmmax").read().strip() == str(16 << 20)
    segments = [libc.shmget(0, 4096, 0o1600) for _ in range(32)]
    capped = capped and sum(s >= 0 for s in segments) <= 16
    try:
        open("/proc/sys/kernel/shmmax", "w").write(str(1 << 40))
        capped = False
    except OSError:
        pass
    capped = capped and open("/proc/self/oom_score_adj").read().strip() == "1000"
    try:
        open("/proc/self/oom_score_adj", "w").write("-1000")
        capped = False
    except OSError:
        pass
    if capped:
        raise PermissionError("IPC capped, OOM priority fixed")
    return x + 1
