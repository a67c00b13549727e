"""Generation (rollout side) and log-prob computation (learner side) over one batch layout.

`hf.generate` samples with a KV cache; `logprobs` is the learner's forward; `base.Engine` is the
interface the rollout service serves (`hf_engine.HFEngine`, `vllm.VLLMEngine`), with versioned
weight updates checked by `weights`; `scoring` is what a teacher sends back (sampled / top-k /
full log-probs), computed exactly as the learner computes them.
"""
