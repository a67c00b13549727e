"""initial schema: cascades, stages, runs, steps, evals, checkpoints, events

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29

The one-active-stage index (`uq_stages_one_active`) is the database's guard against two
concurrent starts; `uq_checkpoints_one_teacher` keeps one teacher per (run, domain).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import cascade.store.models

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cascades",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed', 'aborted')",
            name=op.f("ck_cascades_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cascades")),
    )
    op.create_index(op.f("ix_cascades_name"), "cascades", ["name"], unique=False)
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cascade_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("distill", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.Column("ended_at", cascade.store.models.UTCDateTime(), nullable=True),
        sa.Column("output_dir", sa.String(length=1024), nullable=False),
        sa.CheckConstraint("kind IN ('embedded', 'distributed')", name=op.f("ck_runs_kind")),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'failed', 'aborted')", name=op.f("ck_runs_status")
        ),
        sa.ForeignKeyConstraint(
            ["cascade_id"], ["cascades.id"], name=op.f("fk_runs_cascade_id_cascades"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(op.f("ix_runs_cascade_id"), "runs", ["cascade_id"], unique=False)
    op.create_table(
        "stages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cascade_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("domain", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("desired_state", sa.String(length=16), nullable=True),
        sa.Column("steps_done", sa.Integer(), nullable=False),
        sa.Column("started_at", cascade.store.models.UTCDateTime(), nullable=True),
        sa.Column("ended_at", cascade.store.models.UTCDateTime(), nullable=True),
        sa.CheckConstraint(
            "desired_state IN ('pending', 'running', 'paused', 'completed', 'failed', 'aborted')",
            name=op.f("ck_stages_desired_state"),
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'paused', 'completed', 'failed', 'aborted')",
            name=op.f("ck_stages_state"),
        ),
        sa.ForeignKeyConstraint(
            ["cascade_id"], ["cascades.id"], name=op.f("fk_stages_cascade_id_cascades"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stages")),
        sa.UniqueConstraint("cascade_id", "index", name=op.f("uq_stages_cascade_id_index")),
    )
    op.create_index(op.f("ix_stages_cascade_id"), "stages", ["cascade_id"], unique=False)
    op.create_index(
        "uq_stages_one_active",
        "stages",
        ["cascade_id"],
        unique=True,
        sqlite_where=sa.text("state IN ('running', 'paused')"),
        postgresql_where=sa.text("state IN ('running', 'paused')"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("stage_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("global_step", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("domain", sa.String(length=64), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("is_teacher", sa.Boolean(), nullable=False),
        sa.Column("created_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.CheckConstraint("kind IN ('resume', 'teacher', 'final')", name=op.f("ck_checkpoints_kind")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_checkpoints_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["stage_id"], ["stages.id"], name=op.f("fk_checkpoints_stage_id_stages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    op.create_index(op.f("ix_checkpoints_run_id_kind"), "checkpoints", ["run_id", "kind"], unique=False)
    op.create_index(op.f("ix_checkpoints_stage_id"), "checkpoints", ["stage_id"], unique=False)
    op.create_index(
        "uq_checkpoints_one_teacher",
        "checkpoints",
        ["run_id", "domain"],
        unique=True,
        sqlite_where=sa.text("is_teacher = true"),
        postgresql_where=sa.text("is_teacher = true"),
    )
    op.create_table(
        "evals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("stage_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("global_step", sa.Integer(), nullable=False),
        sa.Column("domain", sa.String(length=64), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("created_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_evals_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["stage_id"], ["stages.id"], name=op.f("fk_evals_stage_id_stages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evals")),
        sa.UniqueConstraint(
            "run_id", "stage_id", "step", "domain", name=op.f("uq_evals_run_id_stage_id_step_domain")
        ),
    )
    op.create_index(op.f("ix_evals_run_id_domain"), "evals", ["run_id", "domain"], unique=False)
    op.create_index(op.f("ix_evals_stage_id"), "evals", ["stage_id"], unique=False)
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cascade_id", sa.Integer(), nullable=False),
        sa.Column("stage_id", sa.Integer(), nullable=True),
        sa.Column("at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cascade_id"], ["cascades.id"], name=op.f("fk_events_cascade_id_cascades"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["stage_id"], ["stages.id"], name=op.f("fk_events_stage_id_stages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_cascade_id"), "events", ["cascade_id"], unique=False)
    op.create_index(op.f("ix_events_stage_id"), "events", ["stage_id"], unique=False)
    op.create_table(
        "steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("stage_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("global_step", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", cascade.store.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_steps_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["stage_id"], ["stages.id"], name=op.f("fk_steps_stage_id_stages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint("run_id", "stage_id", "step", name=op.f("uq_steps_run_id_stage_id_step")),
    )
    op.create_index(op.f("ix_steps_run_id_global_step"), "steps", ["run_id", "global_step"], unique=False)
    op.create_index(op.f("ix_steps_stage_id"), "steps", ["stage_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_steps_stage_id"), table_name="steps")
    op.drop_index(op.f("ix_steps_run_id_global_step"), table_name="steps")
    op.drop_table("steps")
    op.drop_index(op.f("ix_events_stage_id"), table_name="events")
    op.drop_index(op.f("ix_events_cascade_id"), table_name="events")
    op.drop_table("events")
    op.drop_index(op.f("ix_evals_stage_id"), table_name="evals")
    op.drop_index(op.f("ix_evals_run_id_domain"), table_name="evals")
    op.drop_table("evals")
    op.drop_index(
        "uq_checkpoints_one_teacher",
        table_name="checkpoints",
        sqlite_where=sa.text("is_teacher = true"),
        postgresql_where=sa.text("is_teacher = true"),
    )
    op.drop_index(op.f("ix_checkpoints_stage_id"), table_name="checkpoints")
    op.drop_index(op.f("ix_checkpoints_run_id_kind"), table_name="checkpoints")
    op.drop_table("checkpoints")
    op.drop_index(
        "uq_stages_one_active",
        table_name="stages",
        sqlite_where=sa.text("state IN ('running', 'paused')"),
        postgresql_where=sa.text("state IN ('running', 'paused')"),
    )
    op.drop_index(op.f("ix_stages_cascade_id"), table_name="stages")
    op.drop_table("stages")
    op.drop_index(op.f("ix_runs_cascade_id"), table_name="runs")
    op.drop_table("runs")
    op.drop_index(op.f("ix_cascades_name"), table_name="cascades")
    op.drop_table("cascades")
