"""The shipped spaces and studies: found by name, and carried by the built wheel."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from cubic.shipped import SHIPPED_DIR, find, shipped

ROOT = Path(__file__).resolve().parents[1]
# What the wheel is built from: pyproject.toml names no other file.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "cubic", "service", "search_spaces")


def test_the_shipped_folder_is_the_repositorys() -> None:
    assert SHIPPED_DIR == ROOT / "search_spaces"


@pytest.mark.parametrize(
    ("ref", "where"),
    [
        ("llm_pretrain.yaml", "llm_pretrain.yaml"),
        ("bench/llama3_8b_h100x16.study.yaml", "bench/llama3_8b_h100x16.study.yaml"),
        ("search_spaces/dlrm_sharding.yaml", "dlrm_sharding.yaml"),
    ],
)
def test_shipped_files_resolve_by_name(ref: str, where: str) -> None:
    assert shipped(ref) == (SHIPPED_DIR / where).resolve()


@pytest.mark.parametrize(
    "ref", ["nope.yaml", "bench", "../pyproject.toml", "search_spaces", str(ROOT / "LICENSE"), ""]
)
def test_nothing_else_resolves_as_shipped(ref: str) -> None:
    assert shipped(ref) is None


def test_find_prefers_the_study_folder_then_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, study = tmp_path / "here", tmp_path / "study"
    here.mkdir()
    study.mkdir()
    monkeypatch.chdir(here)
    assert find("llm_pretrain.yaml", study) == shipped("llm_pretrain.yaml")
    (here / "llm_pretrain.yaml").write_text("mine")
    assert find("llm_pretrain.yaml", study) == Path("llm_pretrain.yaml")
    (study / "llm_pretrain.yaml").write_text("mine")
    assert find("llm_pretrain.yaml", study) == study / "llm_pretrain.yaml"
    assert find("nope.yaml", study) == Path("nope.yaml")  # as written, for the error


def _build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of the sources, built offline with what this environment has."""
    src = tmp / "src"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=junk)
        else:
            shutil.copy2(path, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wheels = sorted((tmp / "dist").glob("cubic-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"cannot build a wheel here: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return wheels[0]


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_outside_the_repository(tmp_path: Path) -> None:
    """pip install of the wheel into a fresh venv, then ``cubic demo --in-process`` from a
    folder with no spaces in it. Dependencies come from this environment (no network)."""
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = email.message_from_bytes(z.read("cubic-0.1.0.dist-info/METADATA"))
    shipped_names = {
        f"search_spaces/{p.relative_to(SHIPPED_DIR)}" for p in SHIPPED_DIR.rglob("*.yaml")
    }
    assert shipped_names and shipped_names <= names
    assert "cubic-0.1.0.dist-info/licenses/LICENSE" in names
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"

    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True, timeout=120,
    )  # fmt: skip
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    # The dependencies: this environment's packages (it is itself a venv, so the new one's
    # --system-site-packages would see the base interpreter's instead), on the path after
    # the new venv's own, so that `cubic` is the wheel's; a plain path line does not run
    # this environment's .pth hooks, which would map `cubic` to the checkout.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    where = subprocess.run(
        [str(python), "-c", "import cubic; print(cubic.__file__)"],
        cwd=elsewhere, env=env, check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(venv)
    proc = subprocess.run(
        [str(venv / "bin" / "cubic"), "demo", "--in-process", "--trials", "8", "--workers", "2",
         "--db", f"sqlite:///{tmp_path / 'demo.db'}"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "llama3-70b-h100x64" in proc.stdout and "speed-up" in proc.stdout
    assert not list(elsewhere.iterdir())  # it read the spaces from the installed package
