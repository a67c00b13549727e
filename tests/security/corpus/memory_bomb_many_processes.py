# expect: memory_limit
# Each process stays under RLIMIT_AS, together they exceed the memory cgroup: the OOM killer acts.
# Every child reports once its memory is touched; a child that dies first closes its pipe unread.
import os
import time


def f(x):
    readers = []
    for _ in range(4):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            block = bytearray(180 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(w, b"k")
            time.sleep(30)
            os._exit(0)
        os.close(w)
        readers.append(r)
    for r in readers:
        if os.read(r, 1) != b"k":
            raise MemoryError("a child died before touching its memory")
    return x + 1
