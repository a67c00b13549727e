# expect: runtime_error
# Unbounded C recursion (the C JSON encoder on a deeply nested list, recursion limit lifted): SIGSEGV.
import json
import sys

sys.setrecursionlimit(10**9)


def f(x):
    nested = []
    for _ in range(200_000):
        nested = [nested]
    return len(json.dumps(nested))
