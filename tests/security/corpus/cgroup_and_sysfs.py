# expect: runtime_error
# Tries to raise its own limits through the cgroup files and to read /sys.
def f(x):
    for path in ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/kernel/notes"):
        try:
            open(path, "w").write("-1")
            return x + 1
        except OSError:
            pass
    raise PermissionError("no /sys")
