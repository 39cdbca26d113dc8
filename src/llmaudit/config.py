"""Typed, validated experiment recipes.

A recipe is a YAML file whose keys equal the field names below; `key=value` overrides on the command
line use dotted paths (`train.epochs=3`). Unknown keys and bad values fail at load time with the key,
the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmaudit.common.errors import UserError
from llmaudit.common.names import SAFE_NAME_RULE, is_safe_name

DEFAULT_TASKS = ("molecule_captioning", "molecule_generation")

ALL_TASKS = (
    "forward_synthesis",
    "retrosynthesis",
    "molecule_captioning",
    "molecule_generation",
    "name_conversion-i2f",
    "name_conversion-i2s",
    "name_conversion-s2f",
    "name_conversion-s2i",
    "property_prediction-esol",
    "property_prediction-lipo",
    "property_prediction-bbbp",
    "property_prediction-clintox",
    "property_prediction-hiv",
    "property_prediction-sider",
)

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"

DEMO_RECIPE = "demo-cpu"


class RecipeError(UserError):
    """A recipe (or an override) is invalid. The message names the key, the value and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, protected_namespaces=())


class BuiltinModelConfig(_Section):
    """Architecture of the tiny built-in model (`model.name: builtin:tiny-qwen2`) used by the CPU demo."""

    hidden_size: int = Field(96, ge=8)
    """Width of the residual stream."""
    intermediate_size: int = Field(192, ge=8)
    """Width of the MLP."""
    num_hidden_layers: int = Field(2, ge=1)
    """Number of transformer blocks."""
    num_attention_heads: int = Field(4, ge=1)
    """Attention heads (must divide hidden_size)."""
    num_key_value_heads: int = Field(2, ge=1)
    """Key/value heads (grouped-query attention, as in Qwen2)."""
    vocab_size: int = Field(384, ge=64)
    """Target size of the byte-level BPE vocabulary trained on the synthetic corpus."""
    pretrain_samples: int = Field(3000, ge=10)
    """Synthetic records (disjoint from every audited sample) the base model learns before fine-tuning."""
    pretrain_epochs: int = Field(4, ge=0)
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


class ModelConfig(_Section):
    """The base causal LM that every run fine-tunes."""

    name: str = "builtin:tiny-qwen2"
    """A Hugging Face hub id (`Qwen/Qwen2.5-0.5B-Instruct`), a local directory, or `builtin:tiny-qwen2`."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) to pin."""
    trust_remote_code: bool = False
    """Allow code shipped with the model to run. Off unless you trust the repository."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights' dtype: auto = float32 on CPU, bfloat16 on GPU."""
    builtin: BuiltinModelConfig = Field(default_factory=BuiltinModelConfig)
    """Settings of the built-in tiny model (ignored for hub or local models)."""


class DataConfig(_Section):
    """Where the SMolInstruct records come from and how the audited pool is drawn."""

    source: Literal["synthetic", "hub", "local"] = "synthetic"
    """synthetic = offline deterministic generator; hub = osunlp/SMolInstruct's data.zip; local = `path`."""
    path: str | None = None
    """For source=local: data.zip, an extracted data.zip directory, a directory of JSONL/parquet files, or one JSONL/parquet file."""
    hub_id: str = "osunlp/SMolInstruct"
    """Dataset repository on the hub (source=hub)."""
    hub_split: Literal["train", "dev", "test"] = "train"
    """SMolInstruct split the pool and the validation set are drawn from."""
    tasks: list[str] = Field(default_factory=lambda: list(DEFAULT_TASKS))
    """SMolInstruct tasks to use."""
    pool_size: int = Field(256, ge=4)
    """Candidate training samples; each run trains on a random subset of them (membership varies)."""
    val_size: int = Field(128, ge=2)
    """Held-out validation samples, never trained on by any run (r_Q and utility)."""
    max_length: int = Field(256, ge=16)
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


class LoraSettings(_Section):
    """LoRA adapter settings (peft)."""

    r: int = Field(8, ge=1)
    """Rank."""
    alpha: float = Field(16, gt=0)
    """Scaling numerator (lora_alpha)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter input."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that receive an adapter."""


class TrainConfig(_Section):
    """Fine-tuning runs: how many, on what subset, and the optimisation."""

    runs: int = Field(8, ge=1)
    """Independent runs (each a random subset of the pool). Offline LiRA needs several runs per sample OUT."""
    member_fraction: float = Field(0.5, gt=0, lt=1)
    """Share of the pool each run trains on (exactly round(fraction * pool_size) samples)."""
    epochs: int = Field(10, ge=1)
    """Passes over the run's training subset."""
    batch_size: int = Field(8, ge=1)
    """Samples per optimizer step."""
    lr: float = Field(2e-3, gt=0)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    checkpoints_per_epoch: int = Field(1, ge=1)
    """Adapter checkpoints saved along the trajectory per epoch (evenly spaced in steps)."""
    seed: int = 0
    """Base seed; run r uses (seed, r) for its subset, its adapter init and its batch order."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: auto = cuda if available."""


class ScoreConfig(_Section):
    """Scoring: which quantizers, on which device, with which batching."""

    quantizers: list[str] = Field(
        default_factory=lambda: ["fp32", "uniform-5", "uniform-3", "uniform-2", "ternary-50", "sign", "hqq-4", "hqq-2"]
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

    quantizer_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-quantizer options, e.g. {hqq-4: {group_size: 32}}."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to score: auto = cuda if available."""
    token_budget: int | None = Field(None, ge=64)
    """Maximum padded tokens per batch (batches are length-sorted); null = 2048 on CPU (smaller batches stay
    in cache: measured faster by benchmarks/bench_scoring.py), 16384 on GPU."""
    head_chunk: int = Field(1024, ge=1)
    """Positions per chunk when applying the output head (bounds logits memory)."""
    cpu_workers: int | None = Field(None, ge=1)
    """CPU scoring: batches scored concurrently by this many threads, the torch threads shared among them;
    null = one per available core ($LLMAUDIT_THREADS caps it), at most one per batch. 1 = one batch at a
    time with all threads inside each op. Memory grows with the workers (one batch each)."""
    processes: int = Field(1, ge=1)
    """Processes that score this store at once on this machine (`llmaudit score` and `audit`): units are
    claimed with file locks, so they share the work; the CPU cores are divided among them. Quantizers whose
    work is single-threaded Python (GPTQ, HQQ) finish sooner with 2 processes on a 2-core CPU than with 1."""
    vocab_stats: bool = True
    """Store per-token mean/std of log p under the model's next-token distribution (Min-K%++)."""
    score_base: bool = True
    """Score the base model once on pool and validation (reference attack, memorization)."""
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
    generation_samples: int = Field(16, ge=0, le=100_000)
    """Validation records answered by greedy generation at each run's final checkpoint, per quantizer, for the
    task metrics (canonical-SMILES exact match, validity, Morgan Tanimoto; BLEU-2/4, ROUGE-L; docs/science.md
    section 11). The tasks take turns; plain-text records are never chosen; more than the validation set takes
    all of it; 0 disables generation."""
    generation_max_new_tokens: int | None = Field(None, ge=1, le=8192)
    """Tokens each answer may have; null = from the data: 1.5 x the subset's longest reference response."""


class AttackConfig(_Section):
    """Membership inference attacks run on every quantizer's final checkpoint."""

    attacks: list[str] = Field(
        default_factory=lambda: [
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
        ]
    )
    """Attacks to run."""
    fpc: Literal["auto", "off"] | float = "auto"
    """Finite population correction of LiRA's OUT variance: auto = 1 - N/N_+ from the manifest."""
    n_boot: int = Field(500, ge=0)
    """Bootstrap resamples for confidence intervals."""
    seed: int = 0
    """Seed of the bootstraps."""


UTILITY_METRICS = (
    "loss",
    "kl",
    "same_top",
    "smiles_exact_match",
    "smiles_validity",
    "smiles_tanimoto",
    "caption_bleu2",
    "caption_bleu4",
    "caption_rouge_l",
    "text_exact_match",
    "text_rouge_l",
)
"""Values of report.utility_metric: the validation-loss ratio, the divergence from full precision, a task metric."""


class ReportConfig(_Section):
    """Release checklist thresholds."""

    max_tpr_at_1pct_fpr: float = Field(0.05, ge=0, le=1)
    """Criterion: the best attack's TPR at 1% FPR must stay below this."""
    min_r_q: float = Field(0.0, ge=0)
    """Criterion: r_Q must be at least this (0 disables)."""
    max_utility_loss: float = Field(0.10, ge=0)
    """Criterion (utility_metric = loss): relative increase of validation loss vs full precision must stay below this."""
    utility_metric: Literal[UTILITY_METRICS] = "loss"  # type: ignore[valid-type]
    """What the checklist's utility criterion judges (docs/science.md section 11): loss = the relative increase
    of validation loss (limit max_utility_loss); kl = mean KL(p_ref || p_q) per validation token in nats, at most
    utility_limit (default 0.05); same_top = the share of validation tokens whose most likely next token agrees
    with full precision, at least utility_limit (default 0.9); a task metric (smiles_exact_match,
    smiles_validity, smiles_tanimoto, caption_bleu2, caption_bleu4, caption_rouge_l, text_exact_match,
    text_rouge_l) = its drop below full precision (reference - quantizer, paired by run) at most utility_limit
    (default 0.05). Every one is a mean over runs judged on its 95% bootstrap interval."""
    utility_limit: float | None = Field(None, ge=0, le=1000)
    """The limit of utility_metric in its own unit (see there); null = that metric's default. Unused for loss."""
    indicator: str = "gap_std_final"
    """The candidate attack-free indicator shown beside the published r_Q (docs/science.md section 8)."""
    min_indicator: float | None = None
    """Criterion on that indicator (higher = more secure), applied only when the indicator passed its
    validation; None disables it."""
    min_runs: int = Field(5, ge=1)
    """A criterion estimated from fewer fine-tuning runs than this is NOT MEASURED, never PASS."""


class ClusterConfig(_Section):
    """Batch settings of `llmaudit submit`: where the shard jobs run and what each one asks for.

    Not part of the experiment identity: moving an experiment between a laptop and a cluster, or
    changing the shard count, never invalidates finished runs or scores."""

    cluster: Literal["local", "slurm"] = "local"
    """local = shard jobs run as processes on this machine (submitit's LocalExecutor); slurm = a SLURM array job."""
    partition: str | None = None
    """SLURM partition (slurm_partition); None = the cluster's default partition."""
    gpus_per_job: int = Field(0, ge=0)
    """GPUs per shard job (gpus_per_node). With cluster=local, each running shard gets its own GPUs via CUDA_VISIBLE_DEVICES."""
    cpus_per_job: int = Field(4, ge=1)
    """CPU cores per shard job (cpus_per_task); also torch's thread count in the job unless LLMAUDIT_THREADS is set."""
    mem_gb: int | None = Field(None, ge=1)
    """Host memory per shard job in GB; None = the cluster's default."""
    time_minutes: int = Field(240, ge=1)
    """Wall-clock limit of one shard job. A job that hits it (or is preempted) is requeued and resumes from disk."""
    array_parallelism: int = Field(16, ge=1)
    """Most shard jobs running at once (slurm_array_parallelism; with cluster=local, concurrent processes)."""
    shards: int = Field(1, ge=1)
    """N: every stage is split round-robin into N shard jobs (`--shard I/N`); finetune uses at most train.runs of them."""
    slurm_additional_parameters: dict[str, Any] = Field(default_factory=dict)
    """Extra sbatch options passed through unchanged, e.g. {account: my-project, qos: normal, constraint: a100}."""
    gpu_model: Literal["h100", "h200", "a100", "l40s", "a6000"] | None = None
    """GPU model of the nodes, for the plan `llmaudit submit` prints (and `llmaudit plan --device`);
    None with gpus_per_job > 0 prices an H100."""
    log_dir: str | None = None
    """Where submitit writes job scripts, pickles and logs; default <output_dir>/jobs."""


class ExperimentConfig(_Section):
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
        return {
            "model": self.model.model_dump(exclude={"trust_remote_code"}),
            "data": self.data.model_dump(),
            "lora": self.lora.model_dump(),
            "train": {k: v for k, v in self.train.model_dump().items() if k != "device"},
        }

    def identity_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """The field names of the section that holds the key at `loc` (None when it is not a config section)."""
    cls = model
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return sorted(cls.model_fields)


def format_validation_error(
    exc: ValidationError, source: str, *, what: str = "recipe", model: type[BaseModel] | None = None
) -> str:
    """One line per invalid key: the dotted key, the value given and what is allowed (for an unknown
    key, the keys its section allows)."""
    model = model or ExperimentConfig
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, tuple(err["loc"]))
            msg = "unknown key (check the spelling)" + (f"; allowed here: {allowed}" if allowed else "")
        problems.append(f"{key} = {err.get('input')!r}: {msg}")
    return f"invalid {what} {source}: " + "; ".join(problems)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise RecipeError(f"override {text!r} is not of the form key=value (e.g. train.epochs=3)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise RecipeError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise RecipeError(f"override {text!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return raw


def resolve_recipe_path(recipe: str | Path | None) -> Path:
    """A path to a YAML file, or the name of a shipped recipe (`demo-cpu`, `qwen2.5-0.5b-smolinstruct`)."""
    if recipe is None:
        recipe = DEMO_RECIPE
    path = Path(recipe)
    if path.is_file():
        return path
    name = str(recipe)
    if "/" not in name and os.sep not in name:
        for candidate in (name, name.removesuffix(".yaml").removesuffix(".yml")):
            shipped = RECIPE_DIR / f"{candidate}.yaml"
            if shipped.is_file():
                return shipped
    available = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
    raise RecipeError(f"recipe {recipe!s} not found: pass a YAML file or one of the shipped recipes {available}.")


def read_recipe_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a recipe file (keys = config field names)."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise RecipeError(f"recipe {path} must be a mapping of keys to values (sections: model, data, train, ...)")
    return raw


def load_recipe(recipe: str | Path | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    path = resolve_recipe_path(recipe)
    raw = apply_overrides(read_recipe_yaml(path), overrides or [])
    return config_from_dict(raw, source=str(path))


def config_from_dict(raw: dict[str, Any], source: str = "(dict)") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, source)) from None


def dump_config(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
