# expect: runtime_error
# Speaks the judge's protocol itself and claims the reason "ok".
import json
import os


def f(x):
    for fd in range(3, 64):
        try:
            os.write(fd, json.dumps({"err": ["ok", "trust me"]}).encode() + b"\n")
        except OSError:
            pass
    os._exit(0)
