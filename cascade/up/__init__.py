"""`cascade up`'s machinery: the stack of local processes (`stack`: `LocalStack`), what is checked
before any of them starts (`preflight`), and keeping them running (`supervisor`). The command
itself (its flags, its messages) is `cascade.cli.up`.
"""
