"""Initial schema: studies, trials, trial events, proxy models.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the CHECK expressions: a migration must not change when models.py does.
STUDY_STATES = "state IN ('running', 'paused', 'stopped', 'completed', 'archived')"
TRIAL_STATES = "state IN ('waiting', 'running', 'complete', 'infeasible', 'failed', 'pruned')"


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "cubic_study",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("workload_kind", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cubic_study")),
        sa.CheckConstraint(STUDY_STATES, name=op.f("ck_cubic_study_state")),
    )
    op.create_index(op.f("ix_cubic_study_workload_kind"), "cubic_study", ["workload_kind"])
    op.create_index(op.f("ix_cubic_study_state"), "cubic_study", ["state"])

    op.create_table(
        "cubic_trial",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("predicted", sa.JSON(), nullable=True),
        sa.Column("worker_id", sa.String(length=255), nullable=True),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        _ts("lease_deadline", nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("retry_of", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        _ts("created_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cubic_trial")),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["cubic_study.id"],
            name=op.f("fk_cubic_trial_study_id_cubic_study"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["retry_of"],
            ["cubic_trial.id"],
            name=op.f("fk_cubic_trial_retry_of_cubic_trial"),
            ondelete="SET NULL",
        ),
        sa.UniqueConstraint("study_id", "number", name=op.f("uq_cubic_trial_study_id_number")),
        sa.CheckConstraint(TRIAL_STATES, name=op.f("ck_cubic_trial_state")),
    )
    op.create_index(op.f("ix_cubic_trial_study_id_state"), "cubic_trial", ["study_id", "state"])
    op.create_index(op.f("ix_cubic_trial_lease_deadline"), "cubic_trial", ["lease_deadline"])
    op.create_index(op.f("ix_cubic_trial_retry_of"), "cubic_trial", ["retry_of"])

    op.create_table(
        "cubic_trial_event",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        _ts("at"),
        sa.Column("worker_id", sa.String(length=255), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cubic_trial_event")),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["cubic_trial.id"],
            name=op.f("fk_cubic_trial_event_trial_id_cubic_trial"),
            ondelete="CASCADE",
        ),
    )
    op.create_index(op.f("ix_cubic_trial_event_trial_id"), "cubic_trial_event", ["trial_id"])

    op.create_table(
        "cubic_proxy_model",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("workload_kind", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        _ts("created_at"),
        sa.Column("n_train", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("model", sa.JSON(), nullable=False),
        sa.Column("features", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cubic_proxy_model")),
        sa.UniqueConstraint(
            "workload_kind", "version", name=op.f("uq_cubic_proxy_model_workload_kind_version")
        ),
    )


def downgrade() -> None:
    op.drop_table("cubic_proxy_model")
    op.drop_index(op.f("ix_cubic_trial_event_trial_id"), table_name="cubic_trial_event")
    op.drop_table("cubic_trial_event")
    op.drop_index(op.f("ix_cubic_trial_retry_of"), table_name="cubic_trial")
    op.drop_index(op.f("ix_cubic_trial_lease_deadline"), table_name="cubic_trial")
    op.drop_index(op.f("ix_cubic_trial_study_id_state"), table_name="cubic_trial")
    op.drop_table("cubic_trial")
    op.drop_index(op.f("ix_cubic_study_state"), table_name="cubic_study")
    op.drop_index(op.f("ix_cubic_study_workload_kind"), table_name="cubic_study")
    op.drop_table("cubic_study")
