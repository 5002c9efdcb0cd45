"""Workloads: what is trained (an LLM or a DLRM) on what cluster, with which training settings.

Pure data with no I/O beyond reading a YAML file on request. A workload file either spells out
every field or starts from a ready-made one and overrides a few::

    preset: llama3_70b
    cluster: {gpu: h200, num_gpus: 128}
    training: {global_batch: 512}
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from cubic.hardware import GPU, get_gpu

OPTIMIZERS = ("adam", "adagrad", "rowwise_adagrad", "sgd")


class WorkloadError(ValueError):
    """A workload description that cannot be used, with the field that is wrong."""


@dataclass(frozen=True, slots=True)
class Cluster:
    gpu: str = "h100_sxm"
    num_gpus: int = 64
    gpus_per_node: int = 8

    @property
    def spec(self) -> GPU:
        return get_gpu(self.gpu)

    @property
    def nodes(self) -> int:
        return max(1, -(-self.num_gpus // self.gpus_per_node))


@dataclass(frozen=True, slots=True)
class LLM:
    """A decoder-only transformer. ``experts > 1`` makes every MLP a mixture of experts."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    gated_mlp: bool = True
    experts: int = 1
    top_k: int = 1
    tied_embeddings: bool = False
    kind: Literal["llm"] = "llm"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_mats(self) -> int:
        return 3 if self.gated_mlp else 2

    def layer_params(self) -> tuple[float, float]:
        """(attention, MLP) weights of one layer; the MLP counts every expert."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h * 2 + 2 * h * kv
        router = h * self.experts if self.experts > 1 else 0
        mlp = self.mlp_mats * h * self.ffn * self.experts + router
        return float(attn), float(mlp)

    def params(self) -> float:
        attn, mlp = self.layer_params()
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * (attn + mlp + 4 * self.hidden) + emb

    def active_params(self) -> float:
        """Weights touched per token (for MoE: top-k experts only)."""
        attn, mlp = self.layer_params()
        mlp_active = self.mlp_mats * self.hidden * self.ffn * self.top_k
        return self.layers * (attn + (mlp_active if self.experts > 1 else mlp)) + (
            self.vocab * self.hidden
        )

    def flops_per_token(self) -> float:
        """Model FLOPs of a forward and backward pass per token, with causal attention.

        6 * active weights (forward 2, backward 4) plus the attention score and value GEMMs,
        ``6 * 2 * layers * seq * hidden`` halved for the causal mask, the count that
        Megatron-LM's MFU figures use without the mask factor.
        """
        return 6.0 * self.active_params() + self.attention_flops_per_token()

    def attention_flops_per_token(self) -> float:
        """The attention core's share of :meth:`flops_per_token` (scores and values, causal):
        it runs in BF16 whatever formats the weight GEMMs use."""
        return 6.0 * self.layers * self.seq_len * self.hidden


@dataclass(frozen=True, slots=True)
class EmbeddingTable:
    name: str
    rows: int
    dim: int
    pooling: float = 1.0


@dataclass(frozen=True, slots=True)
class DLRM:
    """A DLRM-style recommender: sparse features through embedding tables, dense through MLPs."""

    name: str
    tables: tuple[EmbeddingTable, ...]
    dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    interaction: Literal["dot", "dcnv2"] = "dot"
    dcn_rank: int = 512
    dcn_layers: int = 3
    kind: Literal["dlrm"] = "dlrm"

    @property
    def embedding_dim(self) -> int:
        return self.tables[0].dim if self.tables else 0

    def embedding_params(self) -> float:
        return float(sum(t.rows * t.dim for t in self.tables))

    def interaction_width(self) -> int:
        """Width of the vector the top MLP reads."""
        f = len(self.tables) + 1
        d = self.bottom_mlp[-1]
        if self.interaction == "dot":
            return f * (f - 1) // 2 + d
        return f * d

    def dense_params(self) -> float:
        p = 0.0
        width = self.dense_features
        for w in self.bottom_mlp:
            p += width * w + w
            width = w
        x = self.interaction_width()
        if self.interaction == "dcnv2":
            p += self.dcn_layers * (2 * x * self.dcn_rank + x)
        width = x
        for w in self.top_mlp:
            p += width * w + w
            width = w
        return p

    def dense_flops_per_sample(self) -> float:
        """Forward + backward FLOPs of the dense part (MLPs, interaction) per sample."""
        f = len(self.tables) + 1
        d = self.bottom_mlp[-1]
        inter = 2.0 * f * f * d if self.interaction == "dot" else 0.0
        return 3.0 * (2.0 * self.dense_params() + inter)


Model = LLM | DLRM


@dataclass(frozen=True, slots=True)
class Training:
    global_batch: int = 1024
    optimizer: str = "adam"
    precision: str = "bf16"


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    model: Model
    cluster: Cluster = field(default_factory=Cluster)
    training: Training = field(default_factory=Training)

    @property
    def kind(self) -> str:
        return self.model.kind

    @property
    def gpu(self) -> GPU:
        return self.cluster.spec

    def context(self) -> dict[str, Any]:
        """Flat workload fields that search-space expressions may name."""
        ctx: dict[str, Any] = {
            "num_gpus": self.cluster.num_gpus,
            "gpus_per_node": self.cluster.gpus_per_node,
            "nodes": self.cluster.nodes,
            "global_batch": self.training.global_batch,
            **self.gpu.capabilities(self.cluster.gpus_per_node),
        }
        m = self.model
        if isinstance(m, LLM):
            ctx.update(
                layers=m.layers,
                hidden=m.hidden,
                heads=m.heads,
                kv_heads=m.kv_heads,
                ffn=m.ffn,
                vocab=m.vocab,
                seq_len=m.seq_len,
                experts=m.experts,
                top_k=m.top_k,
            )
        else:
            ctx.update(num_tables=len(m.tables), embedding_dim=m.embedding_dim)
        return ctx

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<inline>") -> Workload:
        return _from_dict(d, source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Workload:
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise WorkloadError(f"{path}: cannot read workload: {exc}") from exc
        if not isinstance(doc, dict):
            raise WorkloadError(f"{path}: expected a mapping")
        return _from_dict(doc.get("workload", doc), str(path))


_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
}


def _check_fields(cls: type, d: Any, where: str) -> dict[str, Any]:
    """Refuse unknown keys (with the nearest known name) and values of the wrong type,
    before anything is built from them."""
    if not isinstance(d, dict):
        raise WorkloadError(f"{where}: expected a mapping, got {d!r:.60}")
    known = {f.name: f for f in fields(cls)}
    for key, value in d.items():
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f"; known: {', '.join(known)}"
            raise WorkloadError(f"{where}.{key}: unknown field{hint}")
        want = _SCALARS.get(str(known[key].type))
        if want is not None and (
            not isinstance(value, want) or (isinstance(value, bool) and bool not in want)
        ):
            raise WorkloadError(f"{where}.{key}: expected {known[key].type}, got {value!r:.60}")
    return d


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    _check_fields(cls, d, where)
    try:
        return cls(**d)
    except TypeError as exc:
        raise WorkloadError(f"{where}: {exc}") from exc


def _model_from_dict(d: dict[str, Any], where: str) -> Model:
    d = dict(d)
    kind = d.get("kind", "llm")
    if kind == "llm":
        return _build(LLM, d, f"{where}: model")
    if kind == "dlrm":
        tables = d.pop("tables", None)
        if not tables:
            raise WorkloadError(f"{where}: model.tables: a DLRM needs at least one table")
        d["tables"] = tuple(
            t if isinstance(t, EmbeddingTable) else _build(EmbeddingTable, t, f"{where}: table")
            for t in tables
        )
        for k in ("bottom_mlp", "top_mlp"):
            if k in d:
                d[k] = tuple(d[k])
        return _build(DLRM, d, f"{where}: model")
    raise WorkloadError(f"{where}: model.kind: expected 'llm' or 'dlrm', got {kind!r}")


def _from_dict(d: dict[str, Any], source: str) -> Workload:
    if not isinstance(d, dict):
        raise WorkloadError(f"{source}: workload: expected a mapping")
    d = dict(d)
    preset = d.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise WorkloadError(
                f"{source}: preset: unknown workload {preset!r}; "
                f"known: {', '.join(sorted(PRESETS))}"
            )
        base = PRESETS[preset]
        model = base.model
        if "model" in d:
            model = _model_from_dict({**asdict(base.model), **d.pop("model")}, source)
        cluster = replace(
            base.cluster, **_check_fields(Cluster, d.pop("cluster", {}), f"{source}: cluster")
        )
        training = replace(
            base.training, **_check_fields(Training, d.pop("training", {}), f"{source}: training")
        )
        name = d.pop("name", base.name)
    else:
        if "model" not in d:
            raise WorkloadError(f"{source}: workload.model: missing (or give a 'preset')")
        model = _model_from_dict(d.pop("model"), source)
        cluster = _build(Cluster, d.pop("cluster", {}), f"{source}: cluster")
        training = _build(Training, d.pop("training", {}), f"{source}: training")
        name = d.pop("name", model.name)
    if d:
        raise WorkloadError(f"{source}: workload: unknown field(s) {sorted(d)}")
    wl = Workload(name=name, model=model, cluster=cluster, training=training)
    _validate(wl, source)
    return wl


def _validate(wl: Workload, source: str) -> None:
    try:
        wl.gpu  # noqa: B018 - raises on an unknown GPU
    except ValueError as exc:
        raise WorkloadError(f"{source}: cluster.gpu: {exc}") from exc
    if wl.cluster.num_gpus < 1:
        raise WorkloadError(f"{source}: cluster.num_gpus: must be at least 1")
    if wl.training.global_batch < 1:
        raise WorkloadError(f"{source}: training.global_batch: must be at least 1")
    if wl.training.optimizer not in OPTIMIZERS:
        raise WorkloadError(
            f"{source}: training.optimizer: expected one of {OPTIMIZERS}, "
            f"got {wl.training.optimizer!r}"
        )
    m = wl.model
    if isinstance(m, LLM):
        if m.hidden % m.heads:
            raise WorkloadError(f"{source}: model.heads: must divide hidden ({m.hidden})")
        if m.heads % m.kv_heads:
            raise WorkloadError(f"{source}: model.kv_heads: must divide heads ({m.heads})")
        if m.top_k > m.experts:
            raise WorkloadError(f"{source}: model.top_k: cannot exceed experts ({m.experts})")


# Criteo 1TB (MLPerf DLRM): 26 categorical features; row counts as published with the data
# set, the multi-hot pooling factors of MLPerf's DLRM-DCNv2 reference.
CRITEO_ROWS = (
    40000000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40000000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40000000,
    40000000,
    40000000,
    590152,
    12973,
    108,
    36,
)
CRITEO_MULTIHOT = (
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
)


def _criteo_tables(pooling: tuple[int, ...] | None) -> tuple[EmbeddingTable, ...]:
    return tuple(
        EmbeddingTable(f"t{i}", rows, 128, float(pooling[i]) if pooling else 1.0)
        for i, rows in enumerate(CRITEO_ROWS)
    )


def _llm(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    ffn: int,
    vocab: int,
    seq: int,
    gated: bool,
) -> LLM:
    return LLM(name, layers, hidden, heads, kv, ffn, vocab, seq, gated)


PRESETS: dict[str, Workload] = {
    w.name: w
    for w in (
        # Brown et al. 2020; trained at 2048 tokens, as in Megatron-LM's SC21 runs.
        Workload(
            "gpt3_175b",
            _llm("gpt3_175b", 96, 12288, 96, 96, 49152, 51200, 2048, False),
            Cluster("a100_80gb", 1024),
            Training(1536),
        ),
        # Llama 3 herd of models (Meta, 2024), model card shapes.
        Workload(
            "llama3_8b",
            _llm("llama3_8b", 32, 4096, 32, 8, 14336, 128256, 8192, True),
            Cluster("h100_sxm", 64),
            Training(512),
        ),
        Workload(
            "llama3_70b",
            _llm("llama3_70b", 80, 8192, 64, 8, 28672, 128256, 8192, True),
            Cluster("h100_sxm", 64),
            Training(512),
        ),
        Workload(
            "llama3_405b",
            _llm("llama3_405b", 126, 16384, 128, 8, 53248, 128256, 8192, True),
            Cluster("h100_sxm", 1024),
            Training(1024),
        ),
        Workload(
            "dlrm_criteo_dot",
            DLRM("dlrm_criteo_dot", _criteo_tables(None)),
            Cluster("a100_80gb", 8),
            Training(65536, optimizer="rowwise_adagrad"),
        ),
        Workload(
            "dlrm_criteo_dcnv2",
            DLRM(
                "dlrm_criteo_dcnv2",
                _criteo_tables(CRITEO_MULTIHOT),
                bottom_mlp=(512, 256, 128),
                top_mlp=(1024, 1024, 512, 256, 1),
                interaction="dcnv2",
                dcn_rank=512,
                dcn_layers=3,
            ),
            Cluster("a100_80gb", 8),
            Training(65536, optimizer="rowwise_adagrad"),
        ),
    )
}


def get_workload(name_or_path: str | Path) -> Workload:
    """A ready-made workload by name, or one loaded from a YAML file."""
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return PRESETS[name_or_path]
    p = Path(name_or_path)
    if p.exists():
        return Workload.from_yaml(p)
    raise WorkloadError(
        f"unknown workload {str(name_or_path)!r}: not a file and not one of "
        f"{', '.join(sorted(PRESETS))}"
    )
