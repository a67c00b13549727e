# expect: memory_limit
# Grows a list of 10 MB blocks until RLIMIT_AS refuses.
blocks = []


def f(x):
    while True:
        blocks.append(bytearray(10 << 20))
