"""The DLRM simulator: formulas against hand-computed cases, published runs, and landscape."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import cubic
from cubic.sim import dlrm
from cubic.sim.dlrm import (
    a2a_bytes,
    a2a_bytes_per_element,
    bench_dlrm,
    cache_hit_rate,
    lookup_bytes,
    lossy_ratio,
    row_case,
    simulate_dlrm,
)
from cubic.workload import DLRM, PRESETS, Cluster, EmbeddingTable, Training, Workload

DCN = PRESETS["dlrm_criteo_dcnv2"]  # 8x a100_80gb
DOT = PRESETS["dlrm_criteo_dot"]
H100_64 = replace(DCN, cluster=Cluster("h100_sxm", 64, 8))
RUNS = Path(cubic.__file__).parent / "data" / "published_runs.csv"


def _wl(tables, gpus=8, gpu="a100_80gb", optimizer="rowwise_adagrad") -> Workload:
    return Workload(
        "t", DLRM("t", tuple(tables)), Cluster(gpu, gpus, 8), Training(optimizer=optimizer)
    )


def _thr(wl, configs):
    return simulate_dlrm(wl, configs).throughput


# ---- formulas -----------------------------------------------------------------------------


def test_lookup_bytes_per_optimizer():
    # forward gather + backward read and write of a 128 x fp32 row, plus state read + write
    assert lookup_bytes(128, "sgd") == 3 * 512
    assert lookup_bytes(128, "rowwise_adagrad") == 3 * 512 + 2 * 4
    assert lookup_bytes(128, "adagrad") == 3 * 512 + 2 * 512
    assert lookup_bytes(128, "adam") == 3 * 512 + 2 * 1024


def test_a2a_bytes_per_precision():
    fp32 = 4096 * 26 * 128 * 4
    assert a2a_bytes(4096, 26 * 128, "fp32") == fp32
    assert a2a_bytes(4096, 26 * 128, "bf16") == fp32 / 2
    assert a2a_bytes(4096, 26 * 128, "fp16") == fp32 / 2
    assert a2a_bytes(4096, 26 * 128, "fp8") == fp32 / 4
    assert math.isclose(float(lossy_ratio(1e-3)), 4.0)
    assert math.isclose(float(lossy_ratio(5e-2)), 10.0)
    assert math.isclose(float(a2a_bytes(4096, 26 * 128, "lossy", 5e-2)), fp32 / 10)
    assert np.isnan(a2a_bytes_per_element("int3"))


def test_memory_per_sharding_type():
    big = EmbeddingTable("big", 8_000_000, 128)
    wl = _wl([big])
    res = simulate_dlrm(
        wl,
        [
            {"sharding_large": "table_wise"},
            {"sharding_large": "row_wise"},
            {"sharding_large": "column_wise"},
            {"sharding_large": "table_wise", "placement_large": "cached", "cache_load_factor": 0.2},
            {"sharding_large": "table_wise", "placement_large": "host"},
        ],
    )
    shards, cache = res.memory["embedding_shards"], res.memory["embedding_cache"]
    row = 128 * 4 + 4  # fp32 weights + one row-wise Adagrad value
    assert shards[0] == pytest.approx(8e6 * row)  # whole table on one rank
    assert shards[1] == pytest.approx(8e6 * row / 8)  # rows split over 8 ranks
    assert shards[2] == pytest.approx(8e6 * (32 * 4 + 4))  # one 32-wide shard per rank
    assert cache[3] == pytest.approx(0.2 * 8e6 * 512) and shards[3] == 0  # state on host
    assert shards[4] == 0 and cache[4] == 0
    # table-row-wise: rows split over the 8 ranks of the owning node
    two_nodes = _wl([big], gpus=16)
    res = simulate_dlrm(two_nodes, [{"sharding_large": "table_row_wise"}])
    assert res.memory["embedding_shards"][0] == pytest.approx(8e6 * row / 8)
    # data-parallel: a full replica with its gradient on every rank
    mid = EmbeddingTable("mid", 500_000, 128)
    res = simulate_dlrm(_wl([mid]), [{"sharding_medium": "data_parallel"}])
    assert res.memory["embedding_shards"][0] == pytest.approx(500_000 * (512 + 4 + 512))


def test_hit_rate_rises_steeply_with_cache_size():
    f = np.array([0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0])
    hit = cache_hit_rate(f, 40_000_000)
    assert np.all(np.diff(hit) > 0) and hit[-1] == pytest.approx(1.0)
    assert hit[4] > 0.7  # a fifth of the rows serves most lookups
    # Zipf closed forms: ln k / ln N at a = 1; (k^(1-a) - 1) / (N^(1-a) - 1) otherwise
    assert float(cache_hit_rate(0.1, 1e6, zipf_a=1.0)) == pytest.approx(5 / 6)
    assert float(cache_hit_rate(0.25, 1e4, zipf_a=0.5)) == pytest.approx(49 / 99)


def test_table_wise_imbalance_with_one_huge_table():
    tables = [EmbeddingTable("hot", 100_000, 128, pooling=50.0)] + [
        EmbeddingTable(f"t{i}", 100_000, 128) for i in range(7)
    ]
    wl = _wl(tables, optimizer="sgd")
    res = simulate_dlrm(wl, [{"sharding_medium": "table_wise", "batch_per_gpu": 1024}])
    gpu = wl.gpu
    t = lookup_bytes(128, "sgd") / (gpu.hbm_gbs * 1e9 * dlrm.EMB_HBM_EFF)  # per lookup
    o = 2 * 4 * 128 / (gpu.hbm_gbs * 1e9 * dlrm.ACT_EFF)  # pooled output per sample
    big_b = 1024 * 8
    mean = big_b * (57 * t + 8 * o) / 8  # one table per rank
    assert res.breakdown["embedding_lookup"][0] == pytest.approx(mean)
    assert res.breakdown["imbalance"][0] == pytest.approx(big_b * (50 * t + o) - mean)
    # row-wise spreads the hot table over every rank: no imbalance
    rw = simulate_dlrm(wl, [{"sharding_medium": "row_wise", "batch_per_gpu": 1024}])
    assert rw.breakdown["imbalance"][0] == 0


# ---- published runs -----------------------------------------------------------------------


def _torchrec_rows():
    with RUNS.open() as fh:
        return [r for r in csv.DictReader(fh) if r["framework"] == "torchrec"]


def _dcnv2_rows():
    with RUNS.open() as fh:
        return {
            int(r["num_gpus"]): r
            for r in csv.DictReader(fh)
            if r["dlrm_model"] == "criteo_1tb_dcnv2_multihot" and r["gpu"] == "h100_sxm"
        }


def test_torchrec_reference_runs_within_mape():
    rows = _torchrec_rows()
    assert len(rows) == 5
    errors = []
    for r in rows:
        wl, cfg = row_case(r)
        res = simulate_dlrm(wl, [cfg])
        assert res.feasible[0], res.reason[0]
        errors.append(abs(res.throughput[0] / float(r["value"]) - 1.0))
    assert np.mean(errors) <= 0.12, errors
    assert max(errors) <= 0.25, errors


def test_dcnv2_mlperf_runs_within_ten_percent():
    """HugeCTR's MLPerf Training v3.1 DLRM-DCNv2 results on 8, 64 and 128 H100."""
    rows = _dcnv2_rows()
    assert {8, 64, 128} <= set(rows)
    for r in rows.values():
        wl, cfg = row_case(r)
        res = simulate_dlrm(wl, [cfg])
        assert res.feasible[0], res.reason[0]
        assert abs(res.throughput[0] / float(r["value"]) - 1.0) <= 0.10, r["id"]


def test_dcnv2_throughput_grows_from_64_to_128_h100():
    """Published: 46.84M -> 63.37M samples/s (1.35x); the model must grow too, by most of it."""
    rows = _dcnv2_rows()
    got = {}
    for n in (64, 128):
        wl, cfg = row_case(rows[n])
        got[n] = simulate_dlrm(wl, [cfg]).throughput[0]
    published = float(rows[128]["value"]) / float(rows[64]["value"])
    assert published > 1.3
    assert got[128] / got[64] > 1.15
    assert abs(got[128] / got[64] - published) <= 0.15


def test_balanced_plan_scales_where_the_per_class_plan_does_not():
    """Hotness-balanced shards keep the busiest rank's lookups at the mean; table-wise
    placement leaves the 100-lookup table on one rank."""
    rows = _dcnv2_rows()
    wl, cfg = row_case(rows[128])
    per_class = dict(cfg, embedding_plan="per_class")
    res = simulate_dlrm(wl, [cfg, per_class])
    assert res.throughput[0] > 2.0 * res.throughput[1]
    assert res.breakdown["imbalance"][0] < res.breakdown["imbalance"][1]


def test_row_case_matches_the_reference_setup():
    one = next(r for r in _torchrec_rows() if r["num_gpus"] == "1")
    wl, cfg = row_case(one)
    assert wl.training.optimizer == "sgd" and wl.training.precision == "fp32"
    assert wl.model.tables[0].rows == 45_833_188  # the README's --num_embeddings_per_feature
    assert cfg["placement_large"] == "cached"  # 91 GB of tables on one 40 GB GPU
    assert cfg["pipeline_sparse"] and cfg["batch_per_gpu"] == 16384


# ---- landscape ----------------------------------------------------------------------------


def test_all_tables_in_hbm_on_one_40gb_gpu_do_not_fit():
    one = next(r for r in _torchrec_rows() if r["num_gpus"] == "1")
    wl, cfg = row_case(one)
    res = simulate_dlrm(wl, [dict(cfg, placement_large="hbm", sharding_large="table_wise")])
    assert not res.fits[0]
    assert res.reason[0].startswith("out of memory: 91.1 GB of embedding shards > 40 GB HBM")


def test_low_precision_a2a_faster_only_when_exposed():
    # 64 GPUs, row-wise: the reduce-scatter of the global batch crosses the NIC
    thr = _thr(H100_64, [{"a2a_precision": p} for p in ("fp32", "bf16", "fp8", "lossy")])
    assert thr[2] > thr[1] > thr[0] and thr[3] > thr[0]
    # one GPU: nothing to exchange, so precision changes nothing
    one = replace(DCN, cluster=Cluster("a100_80gb", 1, 8))
    res = simulate_dlrm(
        one, [{"a2a_precision": p, "sharding_large": "table_wise"} for p in ("fp32", "fp8")]
    )
    assert res.step_time[0] == res.step_time[1]


def test_batch_per_gpu_is_not_monotone():
    hbm = _thr(DCN, [{"batch_per_gpu": x} for x in (1024, 4096, 16384)])
    assert hbm[0] < hbm[1] < hbm[2]  # amortises the per-step host cost
    small_cache = {"placement_large": "cached", "cache_load_factor": 0.05}
    cached = _thr(DCN, [dict(small_cache, batch_per_gpu=x) for x in (4096, 16384)])
    assert cached[1] < cached[0]  # the batch no longer fits the cache


def test_sharding_is_not_monotone():
    one_node = _thr(DCN, [{"sharding_large": s} for s in ("table_wise", "row_wise")])
    many = _thr(H100_64, [{"sharding_large": s} for s in ("table_wise", "row_wise")])
    assert one_node[1] > one_node[0]  # row-wise removes the hot table's imbalance
    assert many[0] > many[1]  # table-wise avoids reduce-scattering the global batch
    best = _thr(H100_64, [{"sharding_large": "table_row_wise"}])
    assert best[0] > many.max()


def test_cache_load_factor_is_not_monotone():
    thr = _thr(
        DCN, [{"placement_large": "cached", "cache_load_factor": x} for x in (0.05, 0.2, 0.4)]
    )
    assert thr[0] < thr[1] < thr[2]
    one = next(r for r in _torchrec_rows() if r["num_gpus"] == "1")
    wl, cfg = row_case(one)
    res = simulate_dlrm(wl, [dict(cfg, cache_load_factor=x) for x in (0.2, 0.4)])
    assert res.fits[0] and not res.fits[1]
    assert "embedding cache" in res.reason[1]


def test_dcnv2_slower_than_dot_per_sample():
    dot, dcn = _thr(DOT, [{}])[0], _thr(DCN, [{}])[0]
    assert dcn < dot


def test_placement_and_pipeline():
    thr = _thr(DCN, [{"placement_large": p} for p in ("hbm", "cached", "host")])
    assert thr[0] > thr[1] > thr[2]
    piped = _thr(DCN, [{"pipeline_sparse": False}, {"pipeline_sparse": True}])
    assert piped[1] > piped[0]


def test_fp8_helps_only_large_gemms_and_costs_accuracy():
    wl = replace(DCN, cluster=Cluster("h100_sxm", 8, 8))
    for site, large_helps in (("fp8_interaction", True), ("fp8_bottom_mlp", False)):
        res = simulate_dlrm(
            wl, [{"batch_per_gpu": b, site: f} for b in (512, 16384) for f in (False, True)]
        )
        dense = res.breakdown["dense_compute"]
        assert dense[1] > dense[0]  # small batch: the casts cost more than they save
        assert (dense[3] < dense[2]) == large_helps
        assert res.error_score[1] > res.error_score[0] == 0
    # no FP8 on A100: the flag changes nothing
    res = simulate_dlrm(DCN, [{}, {"fp8_top_mlp": True}])
    assert res.step_time[0] == res.step_time[1] and res.error_score[1] == 0


def test_error_score_by_a2a_precision():
    cfgs = [{"a2a_precision": p} for p in ("fp32", "fp16", "bf16", "fp8")] + [
        {"a2a_precision": "lossy", "lossy_error_bound": eb} for eb in (1e-3, 5e-2)
    ]
    err = simulate_dlrm(DCN, cfgs).error_score
    assert err[0] == 0 < err[1] < err[2] < err[3]
    assert err[4] < err[5]


def test_invalid_configs_have_reasons():
    res = simulate_dlrm(
        DCN,
        [
            {"sharding_large": "data_parallel"},
            {"sharding_medium": "diagonal"},
            {"placement_large": "ssd"},
            {"a2a_precision": "int4"},
            {"a2a_precision": "lossy", "lossy_error_bound": 0.0},
            {"placement_large": "cached", "cache_load_factor": 0.0},
            {"batch_per_gpu": 0},
            # inactive knobs at their search-space placeholders are fine
            {"a2a_precision": "fp32", "lossy_error_bound": 0.0, "cache_load_factor": 1.0},
        ],
    )
    assert not res.valid[:7].any() and all(res.reason[:7])
    assert "data_parallel" in res.reason[0]
    assert res.feasible[7] and res.reason[7] == ""
    assert np.all(res.throughput[:7] == 0)


def test_host_memory_bound():
    tiny_host = replace(H100_64, cluster=Cluster("h100_sxm", 8, 8))
    wl = replace(
        tiny_host,
        model=replace(
            DCN.model,
            tables=tuple(
                replace(t, rows=t.rows * 100) if t.rows >= 1_000_000 else t
                for t in DCN.model.tables
            ),
        ),
    )
    res = simulate_dlrm(wl, [{"placement_large": "host"}])
    assert not res.fits[0] and "host memory" in res.reason[0]


def test_batch_equals_one_at_a_time():
    rng = np.random.default_rng(1)
    wl = replace(DCN, cluster=Cluster("a100_40gb", 16, 8))
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    cfgs = [
        {
            "sharding_large": pick(dlrm.SHARDINGS[:4]),
            "sharding_medium": pick(dlrm.SHARDINGS),
            "sharding_small": pick(dlrm.SHARDINGS),
            "placement_large": pick(dlrm.PLACEMENTS),
            "cache_load_factor": pick([0.05, 0.2, 0.4]),
            "a2a_precision": pick(["fp32", "bf16", "fp8", "lossy"]),
            "lossy_error_bound": pick([1e-3, 5e-2]),
            "batch_per_gpu": pick([512, 4096, 65536, 262144]),
            "pipeline_sparse": pick([False, True]),
        }
        for _ in range(60)
    ]
    batch = simulate_dlrm(wl, cfgs)
    soa = simulate_dlrm(wl, {k: [c[k] for c in cfgs] for k in cfgs[0]})
    for i, c in enumerate(cfgs):
        one = simulate_dlrm(wl, [c])
        assert one.row(0) == batch.row(i)
        assert soa.row(i) == batch.row(i)
    assert not batch.fits.all() and batch.feasible.any()


def test_breakdown_sums_to_step_time():
    res = simulate_dlrm(H100_64, [{}, {"sharding_large": "table_wise"}])
    total = sum(res.breakdown.values())
    np.testing.assert_allclose(total, res.step_time)
    for key in ("embedding_lookup", "a2a", "dense_compute", "dp_comm", "optimizer", "imbalance"):
        assert key in res.breakdown
    assert res.kind == "dlrm" and res.throughput_unit == "samples/s"


def test_bench_runs():
    assert bench_dlrm(2_000) > 0
