# expect: runtime_error
# Capability-needing calls: sethostname and a raw socket.
import socket


def f(x):
    socket.sethostname("pwned")
    return x + 1
