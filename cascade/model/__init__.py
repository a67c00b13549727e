"""Loading and using a model (tiny or real): checkpoints, chat rendering, reward models."""
