# expect: ok
# Double-forks a daemon in a new session that tries to outlive the execution; the answers are right.
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
        open("/tmp/daemon-was-here", "w").write("still running")
    os._exit(0)


def f(x):
    return x + 1
