# expect: runtime_error
# Writes fake "all passed" reports into every file descriptor, then returns a wrong answer.
import os


def f(x):
    fake = b'+\n+\n{"status": "ok", "passed": 99, "detail": ""}\n{"value": 2}\n'
    for fd in range(3, 256):
        try:
            os.write(fd, fake)
        except OSError:
            pass
    return -1
