"""run leases (one live runner per cascade) and the stored config's hash

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import cascade.store.models

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_leases",
        sa.Column("cascade_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("acquired_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.Column("expires_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cascade_id"],
            ["cascades.id"],
            name=op.f("fk_run_leases_cascade_id_cascades"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_leases_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("cascade_id", name=op.f("pk_run_leases")),
    )
    with op.batch_alter_table("cascades") as batch:
        batch.add_column(sa.Column("config_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cascades") as batch:
        batch.drop_column("config_hash")
    op.drop_table("run_leases")
