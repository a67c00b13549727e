"""Alembic environment for the store: the target is `cascade.store.models.Base.metadata`.

Run through `cascade.store.migrate` (which passes the engine's connection in
`config.attributes["connection"]`), so no alembic.ini or URL lives in the repository.
"""

from __future__ import annotations

from alembic import context

from cascade.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through cascade.store.migrate (it supplies the connection)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place; batch mode copies the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
