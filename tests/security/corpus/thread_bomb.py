# expect: runtime_error
# Starts threads until the process cap refuses (threads count as processes).
import threading
import time


def f(x):
    while True:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
