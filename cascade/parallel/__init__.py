"""The learner over several ranks: `torch.distributed` process groups launched by `torchrun`,
the policy sharded with FSDP2 (`fully_shard`), rank 0 driving the stage loop and the other
ranks following it (docs/sharded-learner.md)."""
