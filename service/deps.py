"""Dependencies of the route handlers, as ``Annotated`` aliases.

The lifespan puts the store, the tuner and the settings on ``app.state``; handlers receive
them through these aliases and never build their own. The getters only read attributes, so
they are ``async`` (no thread hop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request

from cubic.errors import InvalidInput
from cubic.store import Store
from cubic.tuner import Tuner
from service.settings import ServiceSettings


async def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_tuner(request: Request) -> Tuner:
    return request.app.state.tuner


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
TunerDep = Annotated[Tuner, Depends(get_tuner)]


MAX_ID = 2**31 - 1
"""The largest id or offset the databases' INTEGER columns hold: beyond it is a 422, not a
database error."""

StudyId = Annotated[int, Path(ge=1, le=MAX_ID, description="study id")]
TrialId = Annotated[int, Path(ge=1, le=MAX_ID, description="trial id")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID, description="token id")]


@dataclass(frozen=True, slots=True)
class Page:
    limit: int
    offset: int


async def get_page(
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, description="page size (at most CUBIC_MAX_PAGE_SIZE)")] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID, description="items to skip")] = 0,
) -> Page:
    """``limit``/``offset``; a limit above the server's maximum is refused, not cut short."""
    if limit > settings.max_page_size:
        raise InvalidInput(f"limit: at most {settings.max_page_size} items per page", field="limit")
    return Page(limit, offset)


PageDep = Annotated[Page, Depends(get_page)]
#: An optional workload-kind filter of a listing.
KindQuery = Annotated[
    str | None,
    Query(max_length=128, pattern=r"^[^\x00]*$", description="workload kind: llm, dlrm"),
]
