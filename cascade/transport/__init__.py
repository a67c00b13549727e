"""How the distributed mode's processes talk: gRPC server plumbing, the /metrics + /health HTTP
endpoint, and typed clients of the rollout and teacher services (core dataclasses in and out)."""
