"""Who is calling, and whether their role allows it: the one place identity is checked.

A request carries an API token (``Authorization: Bearer cubic_...``, what the CLI, SDK and
workers send from ``CUBIC_TOKEN``). The store keeps only the token's SHA-256 digest. Each
route declares the roles it admits through one of the aliases below; the checks that depend
on the resource (a submitter manages only its own studies, a token made for one study sees
only that one, a worker id belongs to the token that first leased with it) are methods of
:class:`Caller`, called by the route once it knows the resource.

With authentication off (``CUBIC_AUTH=false``; what ``cubic serve`` does on loopback) every
caller is an anonymous admin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import anyio
from fastapi import Depends, Request

from cubic.errors import Forbidden, Unauthorized
from cubic.store import Store, Study
from cubic.store.objects import ApiToken, Role


@dataclass(frozen=True, slots=True)
class Caller:
    """The token behind a request (``None`` when authentication is off)."""

    token: ApiToken | None

    @property
    def role(self) -> Role:
        return Role.ADMIN if self.token is None else self.token.role

    @property
    def token_id(self) -> int | None:
        return None if self.token is None else self.token.id

    def may_see(self, study_id: int) -> bool:
        return self.token is None or self.token.study_id in (None, study_id)

    def check_study(self, study_id: int) -> None:
        """A token made for one study reaches that study only."""
        if not self.may_see(study_id):
            raise Forbidden(f"this token is limited to study {self.token.study_id}")  # type: ignore[union-attr]

    def check_owner(self, study: Study) -> None:
        """Managing a study: admins, and the submitter whose token created it."""
        self.check_study(study.id)
        if self.role == Role.ADMIN:
            return
        if self.role != Role.SUBMITTER or study.owner_token_id != self.token_id:
            raise Forbidden(f"study {study.id} belongs to another submitter")

    def check_worker(self, store: Store, worker_id: str) -> None:
        """Acting as ``worker_id``: the id is bound to the first token that leases with it,
        so nobody else gets its running trials (and their lease tokens) back."""
        if self.token is None:
            return
        owner = store.bind_worker(worker_id, self.token.id)
        if owner != self.token.id:
            raise Forbidden(f"worker id {worker_id!r} belongs to another token")

    def check_lease_holder(self, store: Store, worker_id: str | None) -> None:
        """Heartbeat, report or release of a trial: its worker's token, or an admin."""
        if self.token is None or self.role == Role.ADMIN:
            return
        if worker_id is None or store.worker_token(worker_id) != self.token.id:
            raise Forbidden("this trial is leased by another worker")


async def authenticate(request: Request) -> Caller:
    """The caller of a request (401 without a valid token). Async, so that a request with
    authentication off makes no thread hop for it; the token's lookup reads the database,
    in a worker thread."""
    if not request.app.state.settings.auth:
        return Caller(None)
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized(
            "an API token is needed: send 'Authorization: Bearer <token>' (the CLI and "
            "workers read CUBIC_TOKEN; an admin creates one with `cubic token create`)"
        )
    token = await anyio.to_thread.run_sync(request.app.state.store.token_for, secret.strip())
    if token is None:
        raise Unauthorized("unknown API token")
    if token.revoked:
        raise Unauthorized(f"API token {token.id} ({token.name}) was revoked")
    return Caller(token)


def require(*roles: Role) -> object:
    """A dependency admitting ``roles`` (and admins) and returning the :class:`Caller`."""
    allowed = {Role.ADMIN, *roles}

    async def check(caller: Annotated[Caller, Depends(authenticate)]) -> Caller:
        if caller.role not in allowed:
            names = ", ".join(sorted(r.value for r in allowed))
            raise Forbidden(f"a {caller.role.value} token may not do this (needs: {names})")
        return caller

    return Depends(check)


AnyRole = Annotated[Caller, require(Role.SUBMITTER, Role.WORKER, Role.READER)]
SubmitterRole = Annotated[Caller, require(Role.SUBMITTER)]
WorkerRole = Annotated[Caller, require(Role.WORKER)]
AdminRole = Annotated[Caller, require()]
