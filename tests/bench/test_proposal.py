"""The proposal-round benchmark runs and reports both timings."""

from __future__ import annotations

from cubic.bench.proposal import bench_proposal, bench_sampler_round


def test_bench_proposal_reports_round_times() -> None:
    r = bench_proposal(history=200, n=4, repeat=1)
    assert r["history"] == 200 and r["n"] == 4
    assert r["round_with_fit_s"] > 0 and r["round_on_fitted_proxy_s"] > 0
    assert r["first_round_s"] > 0 and r["survey_s"] > 0


def test_bench_sampler_round_reports_a_round_time() -> None:
    r = bench_sampler_round("tpe", history=32, n=4, repeat=1)
    assert r["strategy"] == "tpe" and r["n"] == 4 and r["round_s"] > 0
