"""Skip a test whose outside component is missing, unless the run says it must be there.

CI sets ``CUBIC_REQUIRE`` (a comma list of ``postgres``, ``slurm``, ``ray``, ``kubernetes``,
``torch``, ``browser``, ``podman``, or ``all``): there a missing component fails the test
instead of skipping it, so a suite that silently tested nothing cannot pass.
"""

from __future__ import annotations

import os

import pytest


def required(component: str) -> bool:
    wanted = {c.strip() for c in os.environ.get("CUBIC_REQUIRE", "").split(",") if c.strip()}
    return component in wanted or "all" in wanted


def need(component: str, available: bool, reason: str) -> None:
    """Skip (or, where required, fail) the calling test when ``component`` is missing."""
    if available:
        return
    if required(component):
        pytest.fail(f"{component} is required here (CUBIC_REQUIRE) but missing: {reason}")
    pytest.skip(f"{component} not available: {reason}")
