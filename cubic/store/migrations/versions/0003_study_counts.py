"""Per-study trial counts and per-study event order, for constant work per lease and report.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTS = ("n_proposed", "n_waiting", "n_running")


def upgrade() -> None:
    # Plain ADD COLUMN on every backend: no table is copied.
    for name in _COUNTS:
        op.add_column(
            "cubic_study", sa.Column(name, sa.Integer(), nullable=False, server_default="0")
        )
    op.add_column(
        "cubic_study", sa.Column("gpu_hours", sa.Float(), nullable=False, server_default="0")
    )
    op.add_column("cubic_trial_event", sa.Column("study_id", sa.Integer(), nullable=True))
    op.create_index(
        op.f("ix_cubic_trial_event_study_id_id"), "cubic_trial_event", ["study_id", "id"]
    )
    # Existing studies: counted once from their trials.
    op.execute(
        "UPDATE cubic_trial_event SET study_id = "
        "(SELECT t.study_id FROM cubic_trial t WHERE t.id = cubic_trial_event.trial_id)"
    )
    op.execute(
        "UPDATE cubic_study SET "
        "n_proposed = (SELECT count(*) FROM cubic_trial t WHERE t.study_id = cubic_study.id "
        "AND t.attempt = 1 AND t.source <> 'imported'), "
        "n_waiting = (SELECT count(*) FROM cubic_trial t WHERE t.study_id = cubic_study.id "
        "AND t.state = 'waiting'), "
        "n_running = (SELECT count(*) FROM cubic_trial t WHERE t.study_id = cubic_study.id "
        "AND t.state = 'running')"
    )
    _backfill_gpu_hours()


def _backfill_gpu_hours() -> None:
    """GPU-hours reported so far, read in Python: JSON access differs between backends."""
    bind = op.get_bind()
    trial = sa.table(
        "cubic_trial",
        sa.column("study_id", sa.Integer),
        sa.column("source", sa.String),
        sa.column("metrics", sa.JSON),
    )
    used: dict[int, float] = {}
    rows = bind.execute(
        sa.select(trial.c.study_id, trial.c.metrics).where(
            trial.c.source != "imported", trial.c.metrics.is_not(None)
        )
    )
    for study_id, metrics in rows:
        v = (metrics or {}).get("gpu_hours") if isinstance(metrics, dict) else None
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            used[study_id] = used.get(study_id, 0.0) + float(v)
    study = sa.table("cubic_study", sa.column("id", sa.Integer), sa.column("gpu_hours", sa.Float))
    for study_id, hours in used.items():
        bind.execute(sa.update(study).where(study.c.id == study_id).values(gpu_hours=hours))


def downgrade() -> None:
    op.drop_index(op.f("ix_cubic_trial_event_study_id_id"), table_name="cubic_trial_event")
    with op.batch_alter_table("cubic_trial_event") as batch:
        batch.drop_column("study_id")
    with op.batch_alter_table("cubic_study") as batch:
        for name in (*_COUNTS, "gpu_hours"):
            batch.drop_column(name)
