"""``cubic bench --through-service``: a run through a real API process and HTTP workers."""

from __future__ import annotations

from pathlib import Path

from cubic.bench.search import landscape, load_study, run_one
from cubic.bench.through_service import run_through_service

BENCH = Path(__file__).resolve().parents[2] / "search_spaces" / "bench"


def test_a_run_through_the_service_is_scored_like_an_in_process_one() -> None:
    study = load_study(BENCH / "dlrm_dot_a100x8.study.yaml")
    info = landscape(study)
    served = run_through_service(study, "cubic", 0, workers=4, budget=16, info=info)
    local = run_one(study, "cubic", 0, workers=4, budget=16, info=info)
    for run in (served, local):
        assert run.n_trials == 16 and len(run.curve) == 16
        assert run.best_config is not None
        assert not study.space.validate(run.best_config, study.context)
    # A sanity bound: both searches reached at least half the optimum in 16 trials.
    assert served.best_ratio > 0.5 and local.best_ratio > 0.5
