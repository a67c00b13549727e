"""lease epochs (every runner write is fenced with the epoch of its lease) and the holder's
process start time (a reused pid is not the holder)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cascades") as batch:
        batch.add_column(sa.Column("lease_epoch", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("run_leases") as batch:
        batch.add_column(sa.Column("epoch", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("pid_start", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_leases") as batch:
        batch.drop_column("pid_start")
        batch.drop_column("epoch")
    with op.batch_alter_table("cascades") as batch:
        batch.drop_column("lease_epoch")
