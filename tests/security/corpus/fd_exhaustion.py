# expect: runtime_error
# Opens files until RLIMIT_NOFILE refuses.
def f(x):
    files = []
    while True:
        files.append(open("/dev/null"))
