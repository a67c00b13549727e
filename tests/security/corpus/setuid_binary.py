# expect: runtime_error
# Execs a setuid-root binary: no_new_privs and the nosuid mounts keep it unprivileged.
import os


def f(x):
    os.execv("/usr/bin/su", ["su", "-c", "id > /tmp/rooted", "root"])
