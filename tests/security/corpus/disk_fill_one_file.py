# expect: runtime_error
# One file past RLIMIT_FSIZE.
def f(x):
    with open("big.bin", "wb") as out:
        for _ in range(64):
            out.write(b"\0" * (1 << 20))
    return x + 1
