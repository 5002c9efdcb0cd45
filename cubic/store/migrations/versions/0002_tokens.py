"""API tokens and roles: tokens (hashed), worker identities, study owners.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = "role IN ('admin', 'submitter', 'worker', 'reader')"  # frozen copy of models.ROLE_CHECK


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "cubic_api_token",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("digest", sa.String(length=64), nullable=False),
        _ts("created_at"),
        _ts("last_used_at", nullable=True),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cubic_api_token")),
        sa.UniqueConstraint("digest", name=op.f("uq_cubic_api_token_digest")),
        sa.CheckConstraint(ROLES, name=op.f("ck_cubic_api_token_role")),
    )
    op.create_table(
        "cubic_worker_identity",
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_cubic_worker_identity")),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["cubic_api_token.id"],
            name=op.f("fk_cubic_worker_identity_token_id_cubic_api_token"),
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        op.f("ix_cubic_worker_identity_token_id"), "cubic_worker_identity", ["token_id"]
    )
    op.add_column("cubic_study", sa.Column("owner_token_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cubic_study") as batch:
        batch.drop_column("owner_token_id")
    op.drop_index(op.f("ix_cubic_worker_identity_token_id"), table_name="cubic_worker_identity")
    op.drop_table("cubic_worker_identity")
    op.drop_table("cubic_api_token")
