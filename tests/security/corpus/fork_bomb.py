# expect: timeout
# A classic fork bomb inside the tested function: the pids cgroup and RLIMIT_NPROC stop it.
import os


def f(x):
    while True:
        try:
            os.fork()
        except OSError:
            pass
