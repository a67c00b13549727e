# expect: timeout
# Sleeps instead of answering, ignoring SIGTERM on the way.
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)


def f(x):
    time.sleep(3600)
