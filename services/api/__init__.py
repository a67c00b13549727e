"""The control plane: REST over `cascade.store` (Postgres) and the live dashboard."""
