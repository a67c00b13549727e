# expect: runtime_error
# Symlinks out of the work dir towards the host's files.
import os


def f(x):
    os.symlink("/proc/1/root/etc/shadow", "shadow")
    os.symlink("/../../../../etc/passwd", "passwd")
    raise RuntimeError(open("shadow").read()[:100] + open("passwd").read()[:100])
