"""The exception hierarchy the service maps to HTTP statuses."""

from __future__ import annotations

import pytest

from cubic.errors import (
    Conflict,
    CubicError,
    InvalidInput,
    LeaseLost,
    NotFound,
    SchemaOutOfDate,
    StorageError,
    TrialFinished,
)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (CubicError, 500),
        (NotFound, 404),
        (Conflict, 409),
        (LeaseLost, 409),
        (TrialFinished, 409),
        (InvalidInput, 422),
        (SchemaOutOfDate, 503),
        (StorageError, 503),
    ],
)
def test_status_codes(error: type[CubicError], status: int) -> None:
    assert issubclass(error, CubicError)
    assert error.status_code == status
    assert error("boom").status_code == status


def test_invalid_input_names_its_field() -> None:
    error = InvalidInput("tp must divide the GPU count", field="space.tp")
    assert str(error) == "tp must divide the GPU count"
    assert error.field == "space.tp"
    assert InvalidInput("bad").field is None
