# expect: runtime_error
# Reads every environment it can find in /proc and raises with it (the detail is returned).
import os


def f(x):
    found = [open("/proc/self/environ", "rb").read()]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found.append(open(f"/proc/{pid}/environ", "rb").read())
            except OSError:
                pass
    raise RuntimeError(repr(b"|".join(found)) + repr(dict(os.environ)))
