# expect: runtime_error
# Looks for the service's files, secrets and the host's shadow file.
def f(x):
    leaked = []
    for path in (
        "/etc/shadow",
        "/root/.bash_history",
        "/tmp/cascade-secret.txt",
        "/work",
        "/proc/1/root/etc/shadow",
    ):
        try:
            leaked.append(open(path).read()[:200])
        except OSError:
            pass
    raise RuntimeError("leaked: " + repr(leaked))
