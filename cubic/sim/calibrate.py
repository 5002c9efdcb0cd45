"""Check the simulated cluster against published training runs.

``cubic/data/published_runs.csv`` (format in ``cubic/data/README.md``) holds measurements
that others published: Megatron-LM on A100 (Narayanan et al. SC21) and H100 (Megatron-Core),
Korthikanti et al. 2022, NVIDIA NeMo 24.07 with FP8, and the TorchRec DLRM reference. Each
row becomes a workload and a configuration; where a row leaves a setting empty, the
configuration takes what the row's ``framework`` did by default at the time (a row that
names none: current Megatron-Core/NeMo), so the model is judged on the runs as they ran.
:func:`validate` reports the error per row and the mean absolute percentage error per
source; :func:`memory_check` compares the memory model with
the per-GPU figures Korthikanti et al. publish.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from cubic.sim.llm import GIB, simulate_llm
from cubic.workload import LLM, Cluster, Training, Workload

#: Framework defaults for settings a row leaves empty, by the row's ``framework`` column:
#: - ``megatron-lm-2021`` (SC21) and ``korthikanti-2022``: plain DDP (no distributed
#:   optimizer), no flash attention (it did not exist yet), no communication overlap.
#:   FP16 gradients are reduced in FP16 (Megatron-LM's default for FP16), except that
#:   Korthikanti et al. count fp32 main gradients (18 bytes per parameter on every rank).
#: - ``megatron-core-0.8`` (2024 README): distributed optimizer, fp32 gradient reduction
#:   (Megatron's default for BF16), flash attention, DP/TP overlap on as the README states.
#: - ``nemo-24.07``: Megatron-Core's distributed optimizer with ``grad_sync_dtype: bf16``,
#:   flash attention, userbuffers TP overlap and DP overlap on, as its recipes set.
FRAMEWORK_DEFAULTS: dict[str, dict[str, Any]] = {
    "megatron-core-0.8": {
        "zero_stage": 1,
        "flash_attention": True,
        "fp32_grads": True,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "tp_comm_overlap": True,
        "sequence_parallel": True,
        "recompute": "none",
    },
    "megatron-lm-2021": {
        "zero_stage": 0,
        "flash_attention": False,
        "sequence_parallel": False,
        "recompute": "full",
    },
    "korthikanti-2022": {
        "zero_stage": 0,
        "flash_attention": False,
        "fp32_grads": True,
        "sequence_parallel": False,
        "recompute": "none",
    },
    "nemo-24.07": {
        "zero_stage": 1,
        "flash_attention": True,
        "fp32_grads": False,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "tp_comm_overlap": True,
        "sequence_parallel": False,
        "recompute": "none",
    },
    "torchrec": {},
    "hugectr": {},
}
#: A run that names no framework: what current Megatron-Core and NeMo releases do unless
#: told otherwise (the distributed optimizer, gradient-reduce and parameter-gather overlap,
#: sequence parallelism with TP and userbuffers TP overlap, flash attention, no recompute).
CURRENT_DEFAULTS: dict[str, Any] = {
    "zero_stage": 1,
    "flash_attention": True,
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "tp_comm_overlap": True,
    "sequence_parallel": True,
    "recompute": "none",
}

#: Korthikanti et al. 2022 (Figure 7 / Table 5 configurations), GiB per A100: weights and
#: optimizer state, activations without recomputation (TP only), activations with sequence
#: parallelism and selective recomputation.
KORTHIKANTI_MEMORY_GIB: dict[str, tuple[float, float, float]] = {
    "22B": (45.6, 59.3, 9.6),
    "175B": (45.6, 66.8, 12.4),
    "530B": (31.6, 114.0, 23.1),
    "1T": (33.0, 131.3, 26.6),
}

METRICS = ("step_time_s", "tokens_per_s_per_gpu", "samples_per_s")


def default_path() -> Path:
    """The packaged copy of the published runs."""
    return Path(str(resources.files("cubic") / "data" / "published_runs.csv"))


def load_rows(path: str | Path | None = None) -> list[dict[str, str]]:
    """Rows of a CSV in the calibration format, as dicts of stripped strings."""
    p = default_path() if path is None else Path(path)
    with p.open(newline="") as fh:
        return [{k: (v or "").strip() for k, v in r.items()} for r in csv.DictReader(fh)]


def _int(row: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    v = row.get(key)
    return default if v in (None, "") else int(float(v))


def _flag(row: Mapping[str, Any], key: str) -> bool | None:
    v = row.get(key)
    if v in (None, ""):
        return None
    return str(v).strip().lower() in ("true", "1", "yes")


def framework_defaults(framework: str | None) -> dict[str, Any]:
    """The defaults that apply to a row of ``framework`` (empty: current Megatron-Core)."""
    if not framework:
        return dict(CURRENT_DEFAULTS)
    if framework not in FRAMEWORK_DEFAULTS:
        known = ", ".join(sorted(FRAMEWORK_DEFAULTS))
        raise ValueError(f"unknown framework {framework!r}; known: {known} (or empty)")
    return dict(FRAMEWORK_DEFAULTS[framework])


def row_case(row: Mapping[str, Any]) -> tuple[Workload, dict[str, Any]]:
    """The workload and configuration of one published run.

    DLRM rows are handed to :func:`cubic.sim.dlrm.row_case`. For LLM rows, empty cells take
    the source framework's defaults (micro-batch 1, one virtual stage, recomputation and
    sequence parallelism as in :data:`FRAMEWORK_DEFAULTS`, or :data:`CURRENT_DEFAULTS` for a
    row that names no framework); ``precision: fp8`` turns on FP8 for
    every GEMM site but the LM head (Transformer Engine's recipe), with BF16 elsewhere.
    """
    if row.get("workload") == "dlrm":
        from cubic.sim import dlrm

        return dlrm.row_case(row)
    model = LLM(
        name=str(row.get("model") or row.get("id") or "llm"),
        layers=_int(row, "layers"),
        hidden=_int(row, "hidden"),
        heads=_int(row, "heads"),
        kv_heads=_int(row, "kv_heads", _int(row, "heads")),
        ffn=_int(row, "ffn"),
        vocab=_int(row, "vocab"),
        seq_len=_int(row, "seq_len"),
        gated_mlp=bool(_flag(row, "gated_mlp")),
    )
    precision = str(row.get("precision") or "bf16").lower()
    train_prec = {"fp16": "fp16", "fp32": "fp32"}.get(precision, "bf16")
    wl = Workload(
        name=str(row.get("id") or model.name),
        model=model,
        cluster=Cluster(str(row["gpu"]), _int(row, "num_gpus"), _int(row, "gpus_per_node", 8)),
        training=Training(global_batch=_int(row, "global_batch"), precision=train_prec),
    )
    cfg = framework_defaults(str(row.get("framework") or ""))
    cfg.update(
        tp=_int(row, "tp", 1),
        pp=_int(row, "pp", 1),
        cp=_int(row, "cp", 1),
        vp=_int(row, "vp", 1),
        micro_batch=_int(row, "micro_batch", 1),
    )
    if _int(row, "dp") is not None:
        cfg["dp"] = _int(row, "dp")
    if row.get("recompute"):
        cfg["recompute"] = str(row["recompute"])
    sp = _flag(row, "sequence_parallel")
    if sp is not None:
        cfg["sequence_parallel"] = sp
    # Userbuffers TP overlap only exists with sequence parallelism.
    if cfg.get("tp_comm_overlap") and not (cfg.get("sequence_parallel") and cfg["tp"] > 1):
        cfg["tp_comm_overlap"] = False
    if precision == "fp8":
        cfg["precision"] = "fp8"
    return wl, cfg


def predict(row: Mapping[str, Any]) -> dict[str, Any]:
    """The simulator's figure for ``row``'s metric, with whether its config fits."""
    wl, cfg = row_case(row)
    if wl.kind == "llm":
        res = simulate_llm(wl, [cfg])
    else:
        from cubic.sim.dlrm import simulate_dlrm

        res = simulate_dlrm(wl, [cfg])
    metric = row["metric"]
    if metric == "step_time_s":
        value = float(res.step_time[0])
    elif metric == "tokens_per_s_per_gpu":
        value = float(res.throughput[0]) / wl.cluster.num_gpus
    elif metric == "samples_per_s":
        value = float(res.throughput[0])
    else:
        raise ValueError(f"row {row.get('id')}: unknown metric {metric!r}; known: {METRICS}")
    return {
        "predicted": value,
        "fits": bool(res.fits[0]),
        "valid": bool(res.valid[0]),
        "reason": str(res.reason[0]),
        "peak_memory_gib": float(res.peak_memory[0]) / GIB,
    }


def _dlrm_missing() -> str:
    """Why DLRM rows cannot be priced here, or '' when :mod:`cubic.sim.dlrm` is complete."""
    try:
        from cubic.sim import dlrm
    except ImportError as exc:
        return f"DLRM model missing: {exc}"
    absent = [f for f in ("row_case", "simulate_dlrm") if not hasattr(dlrm, f)]
    return f"DLRM model lacks {', '.join(absent)}" if absent else ""


def validate(rows: Iterable[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Compare the simulator with published runs.

    Returns ``rows`` (per row: id, source, metric, published, predicted, error_pct, fits,
    reason), ``by_source`` (source -> mean absolute percentage error), ``mape`` (over all
    rows) and ``skipped`` (rows that could not be simulated, with why). A row whose config
    does not fit the memory model keeps its predicted time and is flagged ``fits: False``.
    """
    rows = load_rows() if rows is None else list(rows)
    out: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for row in rows:
        if row.get("workload") == "dlrm":
            note = _dlrm_missing()
            if note:
                skipped.append({"id": str(row.get("id")), "note": note})
                continue
        pred = predict(row)
        published = float(row["value"])
        out.append(
            {
                "id": row.get("id"),
                "source": row.get("source"),
                "workload": row.get("workload"),
                "metric": row["metric"],
                "published": published,
                **pred,
                "error_pct": 100.0 * (pred["predicted"] - published) / published,
            }
        )
    by_source: dict[str, list[float]] = {}
    for r in out:
        by_source.setdefault(str(r["source"]), []).append(abs(r["error_pct"]))
    errs = [abs(r["error_pct"]) for r in out]
    return {
        "rows": out,
        "by_source": {k: float(np.mean(v)) for k, v in by_source.items()},
        "mape": float(np.mean(errs)) if errs else float("nan"),
        "skipped": skipped,
    }


def memory_check(rows: Iterable[Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The memory model against Korthikanti et al.'s per-GPU figures (Table 5 configs).

    For each model: weights + optimizer state (including gradients, as the paper counts
    them), activations without recomputation or sequence parallelism, and activations with
    sequence parallelism and selective recomputation, in GiB, with the error in percent.
    """
    rows = load_rows() if rows is None else list(rows)
    out = []
    seen = set()
    for row in rows:
        if "Korthikanti" not in str(row.get("source")):
            continue
        size = str(row.get("model", "")).split("-")[-1]
        if size in seen or size not in KORTHIKANTI_MEMORY_GIB:
            continue
        seen.add(size)
        wl, cfg = row_case(row)
        base = dict(cfg, recompute="none", sequence_parallel=False)
        sel = dict(cfg, recompute="selective", sequence_parallel=True)
        res = simulate_llm(wl, [base, sel])
        state = (
            res.memory["weights"][0] + res.memory["grads"][0] + res.memory["optimizer"][0]
        ) / GIB
        ours = (state, res.memory["activations"][0] / GIB, res.memory["activations"][1] / GIB)
        pub = KORTHIKANTI_MEMORY_GIB[size]
        for name, o, p in zip(
            ("weights+optimizer", "activations", "activations_sp_selective"), ours, pub, strict=True
        ):
            out.append(
                {
                    "model": f"GPT-{size}",
                    "part": name,
                    "published_gib": p,
                    "predicted_gib": float(o),
                    "error_pct": 100.0 * (float(o) - p) / p,
                }
            )
    return out


def report(result: Mapping[str, Any] | None = None) -> str:
    """A plain-text table of :func:`validate`'s result."""
    result = validate() if result is None else result
    lines = [f"{'id':32} {'published':>12} {'predicted':>12} {'error':>8}  fits"]
    for r in result["rows"]:
        lines.append(
            f"{r['id']:32} {r['published']:12.4g} {r['predicted']:12.4g} "
            f"{r['error_pct']:+7.1f}%  {'yes' if r['fits'] else 'NO ' + r['reason']}"
        )
    lines.append("")
    for src, mape in result["by_source"].items():
        lines.append(f"MAPE {mape:5.1f}%  {src}")
    lines.append(f"MAPE {result['mape']:5.1f}%  overall")
    for s in result.get("skipped", []):
        lines.append(f"skipped {s['id']}: {s['note']}")
    return "\n".join(lines)


__all__ = [
    "CURRENT_DEFAULTS",
    "FRAMEWORK_DEFAULTS",
    "KORTHIKANTI_MEMORY_GIB",
    "load_rows",
    "memory_check",
    "predict",
    "report",
    "row_case",
    "validate",
]
