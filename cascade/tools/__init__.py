"""Tools a policy can call during a rollout, their text format, and the environment that runs them.

- `template`: the tool-call and tool-response format of a chat template, derived by rendering
  sentinel conversations (`ToolFormat`), and the tiny model's tool-aware template.
- `calculator`: exact arithmetic over fractions, parsed (never evaluated as Python), bounded.
- `builtin`: the tools (key-value store get/set/list, `calc`, `python` in the code sandbox).
- `environment`: one episode's tools: each model turn's calls read, checked against the tools'
  schemas, run, and answered; malformed calls answered with an error and counted.
- `episode`: replaying a multi-turn transcript in a fresh environment (what the verifier trusts).
"""
