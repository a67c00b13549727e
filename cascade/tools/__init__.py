"""Tools a policy can call during a rollout, their text format, and the environment that runs them."""
