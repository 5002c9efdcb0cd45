"""API tokens (admins only): create one (its secret is shown once), list them, revoke one."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth import AdminRole
from service.deps import StoreDep, TokenId
from service.schemas import API_ERRORS, TokenCreated, TokenOut, TokenRequest, TokensOut

router = APIRouter(prefix="/v1", tags=["tokens"], responses=API_ERRORS)


@router.post("/tokens", status_code=201, response_model=TokenCreated)
def create_token(req: TokenRequest, caller: AdminRole, store: StoreDep) -> TokenCreated:
    """A new token; ``token`` (the secret) is in this answer only: only its digest is kept."""
    record, secret = store.create_token(req.name, req.role, req.study_id)
    return TokenCreated(**TokenOut.from_token(record).model_dump(), token=secret)


@router.get("/tokens", response_model=TokensOut)
def list_tokens(caller: AdminRole, store: StoreDep) -> TokensOut:
    """Every token, revoked ones included, with when it was last used."""
    return TokensOut(tokens=[TokenOut.from_token(t) for t in store.list_tokens()])


@router.post("/tokens/{token_id:int}:revoke", response_model=TokenOut)
def revoke_token(token_id: TokenId, caller: AdminRole, store: StoreDep) -> TokenOut:
    """Revoke a token for good: every later request with it gets 401."""
    return TokenOut.from_token(store.revoke_token(token_id))
