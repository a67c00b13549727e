# expect: memory_limit
# Each process stays under RLIMIT_AS, together they exceed the memory cgroup: the OOM killer acts.
import os
import time


def f(x):
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = bytearray(180 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
    time.sleep(0.5)
    for pid in pids:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            raise MemoryError(f"child {pid} died with status {status}")
    return x + 1
