"""The search spaces and study files cubic ships, found by name from any folder.

They live in ``search_spaces/`` beside the ``cubic`` package: the repository root in a
source checkout, ``site-packages`` in an installed wheel (which carries the folder as the
``search_spaces`` package's data). One folder serves both, so a study's ``space:
llm_pretrain.yaml`` or ``cubic demo`` works after ``pip install`` without a checkout.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
"""The folder of the shipped spaces (``*.yaml``) and studies (``*.study.yaml``, ``bench/``,
``bench_mo/``)."""


def shipped(ref: str | Path) -> Path | None:
    """The shipped file a relative name refers to (``llm_pretrain.yaml``,
    ``bench/llama3_8b_h100x16.study.yaml``, or the same under ``search_spaces/`` as the
    docs write it), or None. A name that leaves the folder never matches."""
    ref = Path(ref)
    if ref.is_absolute() or not ref.parts:
        return None
    if ref.parts[0] == SHIPPED_DIR.name and len(ref.parts) > 1:
        ref = Path(*ref.parts[1:])
    root = SHIPPED_DIR.resolve()
    path = (root / ref).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return None
    return path


def find(ref: str | Path, base: Path | None = None) -> Path:
    """Where a file reference points: next to ``base`` (a study file's folder), else
    relative to the working directory, else among the shipped files. A reference found
    nowhere comes back as given, so that reading it names what the user wrote."""
    path = Path(ref)
    if base is not None and not path.is_absolute() and (base / path).exists():
        return base / path
    if path.exists():
        return path
    return shipped(path) or path
