# expect: timeout
# Four spinning threads (more would hit the process cap): the wall clock ends it
# (RLIMIT_CPU, counted over all threads, would too).
import threading


def spin():
    while True:
        pass


def f(x):
    for _ in range(4):
        threading.Thread(target=spin, daemon=True).start()
    spin()
