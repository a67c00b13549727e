"""The rollout side of a step: generation requests, generate-and-score, the batch merge.

A step's prompts become `PromptRequest`s (`cascade.runner.planning` plans them, one seed rule);
`generate_and_score` turns one request into a `ScoredChunk` with whatever engine and verifier it
is given (the embedded run passes the policy in this process and the domain objects, a rollout
worker passes the rollout and reward services); `merge_chunks` makes the step's `RolloutBatch`
from its requests' chunks. The same three functions serve both modes.

- `requests`: the request, the chunk, the batch, the merge and the seed rule;
- `scoring`: generate-and-score and the overlong rule;
- `policy`: the policy in this process as a `GenerateFn`.
"""
