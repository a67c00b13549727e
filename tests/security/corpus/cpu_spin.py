# expect: timeout
# Spins at import time.
while True:
    pass
