"""What cubic declares it needs: bounds that hold here, and no GPU libraries on Linux.

A control plane runs on CPUs: XGBoost comes as ``xgboost-cpu`` where that build is published
(Linux, Windows), without the 470 MB NCCL package the default wheel pulls. A dependency whose
new major once broke cubic is bounded below that major.
"""

from __future__ import annotations

import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement

BOUNDED = ("pydantic", "pydantic-settings", "sqlalchemy", "optuna", "typer")
"""Dependencies whose new major changed an API cubic calls."""


def _requirements(extra: str | None = None) -> list[Requirement]:
    """cubic's requirements that apply here (markers evaluated), the core ones by default."""
    out = []
    for line in metadata.requires("cubic") or []:
        req = Requirement(line)
        env = {"extra": extra or ""}
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def test_the_installed_packages_satisfy_the_declared_bounds() -> None:
    wrong = []
    for req in _requirements():
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{req}: not installed")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req}: {version} installed")
    assert not wrong, "reinstall (make .venv/.installed): " + "; ".join(wrong)


def test_dependencies_that_broke_on_a_major_are_bounded_below_the_next() -> None:
    declared = {req.name.lower(): req for req in _requirements()}
    for name in BOUNDED:
        assert any(s.operator == "<" for s in declared[name].specifier), declared[name]


@pytest.mark.skipif(
    sys.platform not in ("linux", "win32"), reason="xgboost-cpu is published for Linux and Windows"
)
def test_xgboost_is_the_cpu_build_without_nccl() -> None:
    names = {req.name.lower() for req in _requirements()}
    assert "xgboost-cpu" in names and "xgboost" not in names
    providers = metadata.packages_distributions().get("xgboost", [])
    assert [p.lower().replace("_", "-") for p in providers] == ["xgboost-cpu"], providers
    nccl = [r for r in metadata.requires("xgboost-cpu") or [] if "nccl" in r.lower()]
    assert not nccl, nccl
    import xgboost

    assert xgboost.XGBRegressor  # `import xgboost` is unchanged
