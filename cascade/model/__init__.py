"""Loading, chat rendering and building of the policy model (tiny or real)."""
