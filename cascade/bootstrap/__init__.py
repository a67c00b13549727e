"""Building the tiny local models from nothing: tokenizer, policy (+ SFT), reward model.

The top of the layering: the policy's build runs evaluations and rollouts (`cascade.eval`,
`cascade.rollout`) to decide when its SFT stops, so nothing below imports it; `cascade model
init` (the CLI) and the tests do.
"""
