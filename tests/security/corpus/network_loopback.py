# expect: runtime_error
# Tries the host's Redis and Postgres on loopback: the network namespace has no route to them.
import socket


def f(x):
    for port in (6379, 5432):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    return x + 1
