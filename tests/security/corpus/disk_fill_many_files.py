# expect: runtime_error
# Many files, each under RLIMIT_FSIZE, until the execution's tmpfs is full.
def f(x):
    for i in range(100000):
        with open(f"fill{i}.bin", "wb") as out:
            out.write(b"\0" * ((1 << 20) - 1))
    return x + 1
