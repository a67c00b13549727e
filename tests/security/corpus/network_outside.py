# expect: runtime_error
# Tries an address outside the host and a DNS lookup.
import socket


def f(x):
    try:
        socket.getaddrinfo("example.com", 443)
    except OSError:
        pass
    socket.create_connection(("1.1.1.1", 443), timeout=0.5).close()
    return x + 1
