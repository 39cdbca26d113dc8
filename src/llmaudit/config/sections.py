"""The sections of a recipe (model, data, lora, train, score, attack, report, cluster) and the whole experiment;
each field documented where it is declared."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from llmaudit.common.errors import did_you_mean
from llmaudit.common.names import SAFE_NAME_RULE, is_safe_name
from llmaudit.config.cluster import ClusterConfig
from llmaudit.config.fields import (
    ALL_TASKS,
    BUILTIN_WHY,
    CHECKPOINTS_WHY,
    CORES_WHY,
    DEFAULT_TASKS,
    FULL_PLACEHOLDER,
    MAX_MASK_CELLS,
    MAX_POOL,
    MAX_QUANTIZERS,
    MAX_RUNS,
    MEMORY_WHY,
    POOL_WHY,
    RECEIVED,
    RUNS_WHY,
    SETS_FOLLOW_QUANTIZERS,
    RecipeSection,
    size_field,
)
from llmaudit.config.release_sets import unknown_set_names
from llmaudit.config.report_section import ReportConfig


class BuiltinModelConfig(RecipeSection):
    """Architecture of the tiny built-in model (`model.name: builtin:tiny-qwen2`) used by the CPU demo."""

    hidden_size: int = size_field(96, ge=8, le=4096, why=BUILTIN_WHY)
    """Width of the residual stream."""
    intermediate_size: int = size_field(192, ge=8, le=16384, why=BUILTIN_WHY)
    """Width of the MLP."""
    num_hidden_layers: int = size_field(2, ge=1, le=64, why=BUILTIN_WHY)
    """Number of transformer blocks."""
    num_attention_heads: int = size_field(4, ge=1, le=128, why=BUILTIN_WHY)
    """Attention heads (must divide hidden_size)."""
    num_key_value_heads: int = size_field(2, ge=1, le=128, why=BUILTIN_WHY)
    """Key/value heads (grouped-query attention, as in Qwen2)."""
    vocab_size: int = size_field(384, ge=64, le=65536, why=BUILTIN_WHY)
    """Target size of the byte-level BPE vocabulary trained on the synthetic corpus."""
    pretrain_samples: int = size_field(3000, ge=10, le=1_000_000, why=BUILTIN_WHY)
    """Synthetic records (disjoint from every audited sample) the base model learns before fine-tuning."""
    pretrain_epochs: int = size_field(4, ge=0, le=1000, why=BUILTIN_WHY)
    """Epochs of full-parameter pre-training of the base model (cached after the first build)."""
    pretrain_lr: float = Field(3e-3, gt=0)
    """Learning rate of that pre-training."""
    seed: int = 1234
    """Seed of the base model's initialisation and pre-training."""

    @model_validator(mode="after")
    def _heads_divide(self) -> BuiltinModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must divide hidden_size={self.hidden_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
        return self


class ModelConfig(RecipeSection):
    """The base causal LM that every run fine-tunes."""

    name: str = "builtin:tiny-qwen2"
    """A Hugging Face hub id (`Qwen/Qwen2.5-0.5B-Instruct`), a local directory, or `builtin:tiny-qwen2`."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) to pin."""
    trust_remote_code: bool = False
    """Allow code shipped with the model to run. Off unless you trust the repository."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of training and scoring, decided once when the run store is created and recorded in it:
    auto = bfloat16 on a GPU; on a CPU bfloat16 where this machine's measured bf16 matmuls are at least 1.3x
    faster than float32 (CPUs with AVX512-BF16 or AMX), else float32. Weights are merged and quantized in
    float32 either way; log-softmax statistics and reductions stay float32."""
    builtin: BuiltinModelConfig = Field(default_factory=BuiltinModelConfig)
    """Settings of the built-in tiny model (ignored for hub or local models)."""


class DataConfig(RecipeSection):
    """Where the SMolInstruct records come from and how the audited pool is drawn."""

    source: Literal["synthetic", "hub", "local"] = "synthetic"
    """synthetic = offline deterministic generator; hub = osunlp/SMolInstruct's data.zip; local = `path`."""
    path: str | None = None
    """For source=local: data.zip, an extracted data.zip directory, a directory of JSONL/parquet files, or one JSONL/parquet file."""
    hub_id: str = "osunlp/SMolInstruct"
    """Dataset repository on the hub (source=hub)."""
    hub_split: Literal["train", "dev", "test"] = "train"
    """SMolInstruct split the pool and the validation set are drawn from."""
    tasks: list[str] = Field(default_factory=lambda: list(DEFAULT_TASKS), max_length=len(ALL_TASKS))
    """SMolInstruct tasks to use."""
    pool_size: int = size_field(256, ge=4, le=MAX_POOL, why=POOL_WHY)
    """Candidate training samples; each run trains on a random subset of them (membership varies)."""
    val_size: int = size_field(128, ge=2, le=MAX_POOL, why=POOL_WHY)
    """Held-out validation samples, never trained on by any run (r_Q and utility)."""
    max_length: int = size_field(256, ge=16, le=131072, why="longer than the context of any model llmaudit supports")
    """Records longer than this many tokens (prompt + response) are dropped before drawing the pool."""
    include_prompt_in_loss: bool = False
    """Train and score on the prompt tokens too (default: response tokens only)."""
    seed: int = 0
    """Seed of the pool/validation draw (and of the synthetic generator)."""

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: list[str]) -> list[str]:
        unknown = [t for t in tasks if t not in ALL_TASKS]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; allowed: {list(ALL_TASKS)}")
        if not tasks:
            raise ValueError("at least one task is needed")
        return tasks

    @model_validator(mode="after")
    def _path_for_local(self) -> DataConfig:
        if self.source == "local" and not self.path:
            raise ValueError("data.source=local needs data.path (data.zip, a directory, or a JSONL/parquet file)")
        return self


class LoraSettings(RecipeSection):
    """LoRA adapter settings (peft)."""

    r: int = size_field(
        8, ge=1, le=4096, why="a rank above the width of the layers it adapts adds parameters, not capacity"
    )
    """Rank."""
    alpha: float = Field(16, gt=0)
    """Scaling numerator (lora_alpha)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter input."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        max_length=256,
    )
    """Module names that receive an adapter."""


class TrainConfig(RecipeSection):
    """Fine-tuning runs: how many, on what subset, and the optimisation."""

    runs: int = size_field(8, ge=1, le=MAX_RUNS, why=RUNS_WHY)
    """Independent runs (each a random subset of the pool). Offline LiRA needs several runs per sample OUT."""
    member_fraction: float = Field(0.5, gt=0, lt=1)
    """Share of the pool each run trains on: exactly round(fraction * pool_size) samples (membership fixed_fraction),
    or each sample's probability of being trained on (independent)."""
    membership: Literal["fixed_fraction", "independent"] = "fixed_fraction"
    """How each run's members are drawn from the pool: fixed_fraction = a uniformly random subset of exactly
    round(member_fraction * pool_size) samples; independent = every pool sample in every run with probability
    member_fraction, independently of the others (what the one-run epsilon lower bound needs, with 0.5;
    docs/science.md section 15). Part of the experiment's identity when not fixed_fraction."""
    epochs: int = size_field(10, ge=1, le=10_000, why=CHECKPOINTS_WHY)
    """Passes over the run's training subset."""
    batch_size: int = size_field(8, ge=1, le=65536, why="a batch larger than any pool llmaudit reads")
    """Samples per optimizer step."""
    lr: float = Field(2e-3, gt=0)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    checkpoints_per_epoch: int = size_field(1, ge=1, le=1000, why=CHECKPOINTS_WHY)
    """Adapter checkpoints saved along the trajectory per epoch (evenly spaced in steps)."""
    seed: int = 0
    """Base seed; run r uses (seed, r) for its subset, its adapter init and its batch order."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: auto = cuda if available."""
    token_budget: int | None = size_field(None, ge=64, le=2**22, why=MEMORY_WHY)
    """Maximum padded tokens per forward/backward pass of fine-tuning: a wider batch is computed in slices of
    rows whose gradients add up to the batch's (the same optimizer step, up to float rounding); null = on a CPU as
    many as keep the activations within 1.5 GiB (SmolLM2-135M: 970, so its batches of 8 x 192 go in two halves;
    the demo's tiny model never slices), on a GPU the whole batch. How the work is cut, not what is trained: not
    part of the experiment's identity."""

    processes: int = size_field(1, ge=1, le=256, why=CORES_WHY)
    """Processes that train this store's runs at once on this machine (`llmaudit finetune` and `audit`, not
    under accelerate/torchrun or `--shard`): each run is claimed with a file lock and trained whole by one process,
    the CPU cores divided among them. A model that computes on one thread (the built-in tiny model) trains the same
    runs, bit for bit, in a fraction of the time; not part of the experiment's identity."""

    @model_validator(mode="after")
    def _bounded_checkpoints(self) -> TrainConfig:
        if self.epochs * self.checkpoints_per_epoch > 10_000:
            raise ValueError(
                f"epochs x checkpoints_per_epoch = {self.epochs * self.checkpoints_per_epoch:,} checkpoints per run "
                f"is above 10,000 ({CHECKPOINTS_WHY})"
            )
        return self


class ScoreConfig(RecipeSection):
    """Scoring: which quantizers, on which device, with which batching."""

    quantizers: list[str] = Field(
        default_factory=lambda: ["fp32", "uniform-5", "uniform-3", "uniform-2", "ternary-50", "sign", "hqq-4", "hqq-2"],
        max_length=MAX_QUANTIZERS,
    )
    """Quantizer names (`llmaudit quantizers` lists them). The first full-precision one is the reference column."""

    @field_validator("quantizers")
    @classmethod
    def _safe_quantizer_names(cls, names: list[str]) -> list[str]:
        bad = [q for q in names if not is_safe_name(q)]
        if bad:
            raise ValueError(f"quantizer names {bad} are not allowed: use {SAFE_NAME_RULE}")
        if not names:
            raise ValueError("at least one quantizer is needed (e.g. [fp32])")
        if len(set(names)) != len(names):
            raise ValueError(f"quantizer names repeat: {names}")
        return names

    def with_reference(self, short_name: str) -> ScoreConfig:
        """This config with the placeholder quantizer `full` (and its options) named for the store's compute dtype
        (`short_name`: fp32, bf16 or fp16); unchanged when it has no `full`."""
        if FULL_PLACEHOLDER not in self.quantizers:
            return self
        names = list(dict.fromkeys(short_name if q == FULL_PLACEHOLDER else q for q in self.quantizers))
        options = {(short_name if k == FULL_PLACEHOLDER else k): v for k, v in self.quantizer_options.items()}
        return self.model_copy(update={"quantizers": names, "quantizer_options": options})

    quantizer_options: dict[str, dict[str, Any]] = Field(default_factory=dict, max_length=MAX_QUANTIZERS)
    """Per-quantizer options, e.g. {hqq-4: {group_size: 32}}."""
    if_available: list[str] = Field(default_factory=list, max_length=MAX_QUANTIZERS)
    """Quantizers scored only where their library is installed: when a recipe loads, each that can run here joins
    score.quantizers, each that cannot is left out, with the reason, there and in the report (planning.targets)."""

    calibration_source: Literal["heldout", "members", "file"] = "heldout"
    """Where the calibrated quantizers (GPTQ, AWQ, the GGUF -imatrix ones) take their calibration text: heldout = the
    store's validation records (never trained on; the utility columns are measured on them too); members = each run's
    own training records (the base model's units: run 0's); file = calibration_file, the same for every run. Each
    calibrated quantizer records it among its options (a store's record without it calibrated on members); a
    quantizer's own option (quantizer_options.NAME.calibration_source) overrides it (docs/science.md "Calibration
    text")."""
    calibration_file: str | None = None
    """The text of calibration_source=file: plain UTF-8 text (documents separated by blank lines) or JSONL with a
    `text` field; its sha256 is recorded with every quantizer that calibrated on it."""

    @model_validator(mode="after")
    def _calibration_file_named(self, info: ValidationInfo) -> ScoreConfig:
        """A recipe that calibrates on a file names it; a run directory never does (the runner passes it to the
        command that reads it: `llmaudit score RUN_DIR score.calibration_file=PATH`)."""
        received = bool((info.context or {}).get(RECEIVED))
        if self.calibration_source == "file" and not self.calibration_file and not received:
            raise ValueError("calibration_source=file needs score.calibration_file=PATH (a text or JSONL file)")
        return self

    engine: Literal["torch", "llama.cpp"] = "torch"
    """What computes the losses of the GGUF quantizers (every gguf-* quantizer, llmaudit's own quantization and a file
    given with `--quantized`): torch on the dequantized weights, or llama.cpp on the quantized file itself (the
    kernels a llama.cpp user runs, on the CPU; needs the `llamacpp` extra). Every other quantizer and the
    full-precision reference are torch's. quantizer_options.NAME.engine overrides it for one GGUF quantizer; a store
    refuses to mix engines under one quantizer name (docs/science.md section 3, "Two scoring engines")."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to score: auto = cuda if available."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype the units are scored in: auto = the run store's compute dtype (model.dtype as resolved when the store
    was created). Recorded by the first `score`; a store is never scored in two dtypes (score a copy without its
    scores/ to compare). The quantizer `full` names this dtype's full precision (bf16, fp32 or fp16)."""
    token_budget: int | None = size_field(None, ge=64, le=2**22, why=MEMORY_WHY)
    """Maximum padded tokens per batch (batches are length-sorted); null = 2048 on CPU (smaller batches stay
    in cache: measured faster by benchmarks/bench_scoring.py), 16384 on GPU."""
    head_chunk: int = size_field(1024, ge=1, le=2**20, why=MEMORY_WHY)
    """Positions per chunk when applying the output head (bounds logits memory)."""
    cpu_workers: int | None = size_field(None, ge=1, le=1024, why=CORES_WHY)
    """CPU scoring: batches scored concurrently by this many threads, the torch threads shared among them;
    null = one per available core ($LLMAUDIT_THREADS caps it), at most one per batch. 1 = one batch at a
    time with all threads inside each op. Memory grows with the workers (one batch each)."""
    processes: int = size_field(1, ge=1, le=256, why=CORES_WHY)
    """Processes that score this store at once on this machine (`llmaudit score` and `audit`): units are
    claimed with file locks, so they share the work; the CPU cores are divided among them. Quantizers whose
    work is single-threaded Python (GPTQ, HQQ) finish sooner with 2 processes on a 2-core CPU than with 1."""
    vocab_stats: bool = True
    """Store per-token mean/std of log p under the model's next-token distribution (Min-K%++)."""
    score_base: bool = True
    """Score the base model once on pool and validation, under the reference (first full-precision)
    quantizer: the reference unit (run -1) that "base" means in the attacks and in memorization."""
    matched_base: bool = False
    """Also score the base model under every other quantizer: the quantization-matched reference of the
    attacks' `*_qbase` variants (ref, EZ-MIA, WBC against the base quantized like the target; docs/science.md
    section 4). One more unit per quantizer; a calibrated quantizer calibrates the base as it calibrates run 0
    (calibration_source). Needs score_base."""
    pool_trajectory: bool = False
    """Also score the pool (training members and non-members) at every checkpoint, not only the final one:
    trajectory indicators of members (gap_std_traj, rq_train) need it. About doubles the scoring work."""
    trajectory: Literal["all", "final"] = "all"
    """Checkpoints scored on the validation set: all (r_Q needs the trajectory) or the final one only."""
    divergence: bool = True
    """At each run's final checkpoint, per validation token: KL(p_ref || p_q) and whether both models' most
    likely token agree, p_ref the unquantized model of the same checkpoint (llama.cpp's --kl-divergence
    statistics, docs/science.md section 11). Costs two vocabulary passes over the validation positions per final
    unit, and one validation pass of the unquantized checkpoint where no identity quantizer (fp32 of an fp32
    model) scored it first."""
    generation_samples: int = size_field(
        16,
        ge=0,
        le=100_000,
        why="each answer is generated token by token at every final unit: more is hours of decoding",
    )
    """Validation records answered by greedy generation at each run's final checkpoint, per quantizer, for the
    task metrics (canonical-SMILES exact match, validity, Morgan Tanimoto; BLEU-2/4, ROUGE-L; docs/science.md
    section 11). The tasks take turns; plain-text records are never chosen; more than the validation set takes
    all of it; 0 disables generation."""
    generation_max_new_tokens: int | None = size_field(
        None,
        ge=1,
        le=8192,
        why="an answer longer than the longest SMolInstruct response by far; the KV cache grows with it",
    )
    """Tokens each answer may have; null = from the data: 1.5 x the subset's longest reference response."""


ATTACK_NAMES = "attack_names"
"""Validation-context key of the registered attacks' names (`config_from_dict(..., attack_names=...)`)."""

LEGACY_ATTACK_NAMES = (
    "loss",
    "min_k",
    "min_k_plus_plus",
    "zlib",
    "ref",
    "loss+zlib",
    "loss+ref",
    "loss+zlib+ref",
    "lira_offline",
    "lira_online",
)
"""A recorded config whose attack list is exactly these is read as asking for every registered attack."""


class AttackConfig(RecipeSection):
    """Membership inference attacks run on every quantizer's final checkpoint."""

    attacks: list[str] = Field(default_factory=lambda: ["all"], min_length=1, max_length=64, validate_default=True)
    """Attacks to run: `all` (the default: every registered attack, `llmaudit.analyze.attacks.registry`) or their
    names. Names are checked against the registry when a recipe loads. A store's recorded config that lists exactly
    every attack of earlier versions asked for all of them and runs the newer ones too, so that an old store's
    report is never weaker than today's."""

    @field_validator("attacks")
    @classmethod
    def _registered_names(cls, names: list[str], info: ValidationInfo) -> list[str]:
        """The attacks of earlier versions are `all` (kept as `all`: the analysis runs every attack registered when it
        runs); with the registry's names in the validation context (`ATTACK_NAMES`, given by the loader above the
        analysis) an unknown name is refused."""
        if names == list(LEGACY_ATTACK_NAMES):
            names = ["all"]
        known = (info.context or {}).get(ATTACK_NAMES)
        if known is None or names == ["all"]:
            return names
        for name in names:
            if name not in known:
                raise ValueError(
                    f"unknown attack {name!r}{did_you_mean(name, known)}; allowed: {', '.join(known)}, all"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"attacks repeat: {names}")
        return names

    fpc: Literal["auto", "off"] | float = "auto"
    """Finite population correction of LiRA's OUT variance: auto = 1 - N/N_+ from the manifest; a number is a
    factor in (0, 1] (1 = no correction)."""

    @field_validator("fpc", mode="plain")
    @classmethod
    def _fpc_in_range(cls, value: Any) -> str | float:
        if value is False or value == "off":  # YAML reads a bare `off` as false
            return "off"
        if value == "auto":
            return value
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if number is None or not math.isfinite(number) or not 0 < number <= 1:
            raise ValueError("fpc must be 'auto', 'off' or a number in (0, 1]")
        return float(number)

    n_boot: int = size_field(
        500,
        ge=0,
        le=100_000,
        why="intervals settle within a few thousand resamples, and each one repeats every attack evaluation",
    )
    """Bootstrap resamples for confidence intervals."""
    seed: int = 0
    """Seed of the bootstraps."""


class ExperimentConfig(RecipeSection):
    """A whole audit: model, data, runs, scoring, attacks and report."""

    name: str = "audit"
    """Experiment name (also the default output directory under the current directory): letters, digits
    and . _ + - only, starting with a letter or digit."""
    output_dir: str | None = None
    """Where the run store goes; default ./llmaudit-out/<name>."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    train: TrainConfig = Field(default_factory=TrainConfig)
    score: ScoreConfig = Field(default_factory=ScoreConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Batch settings for `llmaudit submit` (not part of the experiment identity)."""

    @model_validator(mode="after")
    def _bounded_masks(self) -> ExperimentConfig:
        cells = self.train.runs * self.data.pool_size
        if cells > MAX_MASK_CELLS:
            raise ValueError(
                f"train.runs x data.pool_size = {self.train.runs:,} x {self.data.pool_size:,} = {cells:,} is above "
                f"{MAX_MASK_CELLS:,}: the manifest records one membership character per run and pool sample, and "
                "every command reads it"
            )
        return self

    @field_validator("report")
    @classmethod
    def _release_sets_scored(cls, report: ReportConfig, info: ValidationInfo) -> ReportConfig:
        score = info.data.get("score")  # absent when score itself is invalid (reported on its own)
        if score and (info.context or {}).get(SETS_FOLLOW_QUANTIZERS):  # the recipe's sets, the command line's grid
            kept = [s for s in report.release_sets if not unknown_set_names([s], score.quantizers)]
            report = report.model_copy(update={"release_sets": kept})
        problem = score and unknown_set_names(report.release_sets, score.quantizers)
        if problem:
            raise ValueError(f"release_sets: {problem}")
        return report

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        if not is_safe_name(name):
            raise ValueError(f"the name becomes a directory name: use {SAFE_NAME_RULE}")
        return name

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("llmaudit-out") / self.name

    def identity(self) -> dict[str, Any]:
        """The part of the config that defines the fine-tuned models: changing it makes a new experiment.
        (`model.trust_remote_code` is a permission given by whoever runs a command, not part of it.)"""
        # the default membership design leaves the identity as that of a config without the key
        same = {"membership"} if self.train.membership == "fixed_fraction" else set()
        return {
            "model": self.model.model_dump(exclude={"trust_remote_code"}),
            "data": self.data.model_dump(),
            "lora": self.lora.model_dump(),
            "train": self.train.model_dump(exclude={"device", "token_budget", "processes", *same}),
        }

    def identity_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
