# expect: runtime_error
# kill(-1): every process it may signal, which is only its own execution's PID namespace.
import os
import signal


def f(x):
    os.kill(-1, signal.SIGKILL)
    return x + 1
