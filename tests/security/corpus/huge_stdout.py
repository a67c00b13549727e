# expect: output_limit
# Prints far more than the output budget.
def f(x):
    while True:
        print("A" * 65536)
