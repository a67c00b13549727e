"""Persistence for cascades: the tables every writer shares, and the queries the report needs.

One schema serves the embedded runner (SQLite file per run), the control plane and the
distributed learner (Postgres, migrated by Alembic), so a row means the same thing everywhere.
Import the submodules you need (`models`, `db`, `repo`, `history`, `control` for operator
commands, `migrate` for Alembic); this package imports nothing.
"""
