"""The `cascade` command: `main` (the parser and the dispatch), one module per group of commands
(`run`: validate, run, report; `up`; `host`: model init, sandbox check; `api`: api and stage;
`data`), `flags` (the run flags `cascade run`, `cascade up` and the learner service share),
`engine` (`cascade up`'s rollout-engine flags) and `api_client` (the control plane's
REST client). Nothing here is imported by the rest of `cascade`: the CLI is the top layer.

`python -m cascade.cli` runs the command (`__main__`), as the `cascade` script does.
"""
