# expect: runtime_error
# Writes into the system directories (read-only binds) and the sandbox root (read-only).
def f(x):
    for path in ("/usr/lib/cascade-evil", "/cascade-evil", "/sandbox/evil.py"):
        try:
            open(path, "w").write("pwned")
        except OSError:
            continue
        return x + 1
    raise PermissionError("nothing writable outside the work dir")
