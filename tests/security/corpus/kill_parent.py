# expect: ok
# SIGKILLs its parent, the judge: the judge is its PID namespace's init, which the kernel
# shields from SIGKILL sent from inside the namespace, so the (correct) answers still count.
import os
import signal


def f(x):
    os.kill(os.getppid(), signal.SIGKILL)
    return x + 1
