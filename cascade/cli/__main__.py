"""`python -m cascade.cli ...`: the `cascade` command."""

from cascade.cli.main import main

raise SystemExit(main())
