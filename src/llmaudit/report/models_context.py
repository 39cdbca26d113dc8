"""report.json's typed models of the sections beside the grid and the checklist: provenance, the indicators,
the blind baseline, memorization, utility beyond the loss and the most vulnerable samples."""

from __future__ import annotations

from typing import Any

from llmaudit.report.schema_base import Interval, Num, Stat, _Closed, _Open, _Recorded

# ------------------------------------------------------------------------------------------ provenance


class Adapter(_Recorded):
    r: Any = None
    alpha: Any = None
    dropout: Any = None
    target_modules: list[Any] | None = None


class DataSource(_Recorded):
    fingerprint: str | None = None
    source: Any = None
    route: Any = None
    tasks: list[Any] | None = None
    n_usable: Any = None


class Membership(_Recorded):
    runs: Any = None
    pool_size: int | None = None
    n_train: list[Any] | None = None
    fpc: Num = None


class Training(_Recorded):
    runs: Any = None
    epochs: Any = None
    batch_size: Any = None
    lr: Any = None
    weight_decay: Any = None
    checkpoints_per_epoch: Any = None


class Parameters(_Recorded):
    model_total: Any = None
    adapter_trainable: Any = None


class ModelSource(_Recorded):
    kind: str | None = None
    gguf_file_type: str | None = None
    gguf_file: str | None = None
    gguf_tensor_types: dict[str, Any] = {}
    sha256: str | None = None


class AttackSettings(_Recorded):
    seed: Any = None
    n_boot: Any = None


class IndicatorProtocol(_Recorded):
    estimator: Any = None
    formula: Any = None


class Provenance(_Open):
    """Where the numbers come from: the experiment, model, adapter, data, membership design, seeds, versions."""

    experiment_name: str | None = None
    run_dir: str | None = None
    identity_hash: str | None = None
    model: str | None = None
    adapter: Adapter | None = None
    parameters: Parameters | None = None
    train: Training | None = None
    data: DataSource | None = None
    membership: Membership | None = None
    seeds: dict[str, Any] | None = None
    library_versions: dict[str, str | None] | None = None
    llmaudit_version: str | None = None
    result_schema_version: Any = None
    attack_definitions: dict[str, str] | None = None
    attack_settings: AttackSettings | None = None
    indicator_protocol: IndicatorProtocol | None = None
    model_source: ModelSource | None = None
    origin: str | None = None
    left_out_quantizers: dict[str, str] = {}
    """score.if_available quantizers that could not run where the store was scored: {name: why}."""


class Spearman(_Open):
    optional_keys = frozenset({"rho", "p_value", "n_quantizers", "reason"})
    rho: Num = None
    p_value: Num = None
    n_quantizers: int | None = None
    reason: str | None = None


class IndicatorAgreement(_Open):
    expected_sign: str = "negative"
    rho: Num = None
    p_value: Num = None
    n_quantizers: int | None = None
    attacks_by_sign: dict[str, int] = {}
    alpha: Num = None
    observed_sign: str | None = None
    verdict: str = "not measurable"
    sentence: str = ""


class IndicatorShown(_Open):
    name: str
    version: Any = None
    family: Any = None
    formula: Any = None
    computable: bool = False
    reason: str | None = None
    status: str = "not validated"
    beyond_damage: str = "not measured"
    synthetic_spearman: Num = None
    values: dict[str, Num] = {}
    ci: dict[str, Interval] = {}
    agreement: IndicatorAgreement | None = None


class IndicatorsSummary(_Open):
    primary: str | None = None
    indicators: list[IndicatorShown] = []


class BlindHighest(_Open):
    run: Any = None
    auroc: Num = None
    ci: Interval = None


class BlindBaseline(_Open):
    mean_auroc: Num = None
    highest: BlindHighest | None = None
    runs: int = 0
    warning: str | None = None
    reason: str | None = None
    method: Any = None
    attacks_not_above_it: dict[str, list[str]] = {}


class MemorizationRow(_Open):
    n_runs: int = 0
    member_mean_bits: Stat = Stat()
    nonmember_mean_bits: Stat = Stat()
    mean_difference_bits: Stat = Stat()
    excess_member_bits: Stat = Stat()
    member_bits_per_adapter_param: Stat = Stat()
    member_bits_per_model_param: Stat = Stat()


class Memorization(_Open):
    definition: Any = None
    reference: dict[str, Any] | None = None
    interval: Any = None
    per_quantizer: dict[str, MemorizationRow] = {}
    adapter_capacity_bits: Num = None
    model_capacity_bits: Num = None
    median_adapter_capacity_over_information: Num = None
    capacity_note: str | None = None
    notes: list[Any] = []
    per_run_detail: str | None = None


class UtilitySummary(_Open):
    divergence_definition: Any = None
    divergence_reference: Any = None
    tasks_measured: bool = False
    tasks_reason: str | None = None
    task_metrics: dict[str, Any] = {}
    tasks_not_measured: dict[str, Any] = {}
    generation_samples: Any = None
    generation_max_new_tokens: Any = None
    generation_decoding: Any = None


class Sample(_Closed):
    optional_keys = frozenset({"text"})
    rank: int
    sample_id: str
    score: Num = None
    text: str | None = None


class VulnerableSamples(_Open):
    optional_keys = frozenset({"note"})
    quantizer: str | None = None
    attack: str | None = None
    score_definition: str | None = None
    include_samples: bool = False
    available: bool = False
    samples: list[Sample] = []
    note: str | None = None


class StabilityBySize(_Open):
    k_runs: Any = None
    mean_rho: Num = None
    std_rho: Num = None


class IndicatorStability(_Open):
    optional_keys = frozenset({"by_size"})
    by_size: list[StabilityBySize] = []


class SpearmanVsRQ(_Open):
    optional_keys = frozenset({"attacks"})
    attacks: dict[str, Any] = {}
