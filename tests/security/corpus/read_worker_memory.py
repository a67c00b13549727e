# expect: runtime_error
# Tries to read and write the judge's memory through /proc/<pid>/mem (the judge is not dumpable).
import os


def f(x):
    parent = os.getppid()
    with open(f"/proc/{parent}/mem", "r+b") as mem:
        mem.seek(0x400000)
        mem.read(16)
    return x + 1
