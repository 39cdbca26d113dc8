"""`llmaudit import`: a run store made from a fine-tune the user trained themselves.

Inputs: the base model (every spelling `model.name` takes), one training output directory per run
(`llmaudit.ingest.checkpoints`), each run's training file and one held-out file (`llmaudit.data.formats`).

The store it writes is an ordinary one (`llmaudit score` and `llmaudit report` work on it unchanged):

    pool        every run's training records + the held-out records not in val (non-members of every run);
                membership of run r = "the record is in run r's training file"
    val         a deterministic half of the held-out records, at most MAX_VAL (r_Q's trajectory losses and
                utility; never trained on)
    manifest    imported = {runs: [{source, train_file, train_sha256, checkpoints: [{step, path, format,
                files: {name: sha256}}], trainer, notes}], heldout_file, heldout_sha256, record_format, trainer};
                the checkpoints stay where the training wrote them (scoring checks their digests)

Everything is checked before anything is written: checkpoints found and holding safetensors weights, an
adapter (or full model) that loads onto the base, no record both in a training file and in the held-out
file (a member cannot be a non-member), no other experiment in the output directory. Pickles a trainer
leaves (optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin) are never opened.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmaudit.common.io import atomic_write_text
from llmaudit.common.names import SAFE_NAME_RULE, is_safe_name
from llmaudit.common.runtime import choose_compute_dtype, configure_threads, pick_device
from llmaudit.config import ExperimentConfig, RecipeError, apply_overrides, config_from_dict
from llmaudit.data.records import dataset_fingerprint, record_format, records_to_jsonl
from llmaudit.data.tokenize import format_record
from llmaudit.ingest.checkpoints import Checkpoint, ImportInputError, TrainingOutput, find_checkpoints, weight_shapes
from llmaudit.ingest.draw import ImportData, data_block, read_import_data
from llmaudit.ingest.quantized import check_quantized, parse_quantized, with_quantizers
from llmaudit.models.builtin import is_builtin
from llmaudit.models.layers import count_parameters
from llmaudit.models.loading import (
    import_gptqmodel_quietly,
    load_base_model,
    load_checkpoint_model,
    load_tokenizer,
    model_source,
)
from llmaudit.quantize import missing_reference
from llmaudit.store.run_store import RunStore, StoreError, file_digest

SET_BY_IMPORT = {
    "name": "--name",
    "output_dir": "--out",
    "model.name": "--base",
    "data.source": "the import (local files)",
    "data.path": "--train",
    "data.pool_size": "the files (and --max-train / --max-heldout)",
    "data.val_size": "the held-out file (and --max-heldout)",
    "data.seed": "--seed",
    "data.max_length": "the longest record (in tokens)",
    "train.runs": "the training directories (TRAINING_DIR and --runs)",
    "train.member_fraction": "the files",
}
"""Config keys the import sets from its inputs: an override of them is refused (the option to use instead)."""


@dataclass(frozen=True)
class ImportRequest:
    """What `llmaudit import` is asked to do: the training output directories (one per run), the base model, the
    training file(s) (one per run, or one every run trained on), the held-out file, the output directory, and the
    options of the command line (`--name`, `--format`, `--max-train`, `--max-heldout`, `--seed`, key=value
    overrides, `--trust-remote-code`, `--quantized`)."""

    training_dirs: Sequence[str | Path]
    base: str
    train_files: Sequence[str | Path]
    heldout_file: str | Path
    out: str | Path
    name: str | None = None
    record_format_option: str = "auto"
    max_train: int | None = None
    max_heldout: int | None = None
    seed: int = 0
    overrides: Sequence[str] = ()
    trust_remote_code: bool = False
    quantized: Sequence[str] = ()
    attack_names: tuple[str, ...] | None = None
    """The registered attacks, which an `attack.attacks` override must name (given by the caller that knows the
    registry, `importing.pipeline.run_import`; None: unchecked here, checked when the store is reported)."""

    def resolved(self) -> ImportRequest:
        """The request with its paths expanded (the files resolved), checked (`_check_arguments`), and one training
        file per run (a single --train file stands for every run's)."""
        dirs = [Path(d).expanduser().absolute() for d in self.training_dirs]  # links kept: read where written
        files = [Path(f).expanduser().resolve() for f in self.train_files]
        _check_arguments(dirs, files, self.max_train, self.max_heldout)
        if len(files) == 1 and len(dirs) > 1:
            files = files * len(dirs)
        heldout, out = Path(self.heldout_file).expanduser().resolve(), Path(self.out).expanduser()
        return dataclasses.replace(self, training_dirs=dirs, train_files=files, heldout_file=heldout, out=out)


@dataclass
class ImportResult:
    """What `import_training` found and wrote."""

    store: RunStore
    cfg: ExperimentConfig
    runs: list[TrainingOutput]
    pool_size: int
    val_size: int
    n_train: list[int]
    created: bool = True
    notes: list[str] = field(default_factory=list)
    parameters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _StoreContent:
    """What an import writes beside its records: the manifest's data, imported and model-source sections, and the
    parameter counts."""

    data_info: dict[str, Any]
    imported: dict[str, Any]
    source: dict[str, Any]
    parameters: dict[str, int]


def import_training(request: ImportRequest, *, echo: Callable[[str], Any] = print) -> ImportResult:
    """Check the inputs and write the run store (see the module docstring). Raises a UserError (one line
    naming the file or directory and the fix) before writing anything when an input cannot be used."""
    request = request.resolved()
    out, files, heldout_path = Path(request.out), list(request.train_files), Path(request.heldout_file)

    # 1. The training outputs: checkpoints with safetensors weights (no digest yet, no model loaded).
    runs = [find_checkpoints(d) for d in request.training_dirs]
    given_specs = parse_quantized(request.quantized, len(runs))
    _check_out_dir(out, runs)
    for run, output in enumerate(runs):
        echo(f"[import] run {run}: {len(output.checkpoints)} checkpoint(s) in {output.source}")

    # 2. The data: every file read and mapped, no record both trained on and held out.
    data = read_import_data(
        files, heldout_path, request.record_format_option, request.max_train, request.max_heldout, request.seed
    )
    cfg = _config(request, runs, data)
    configure_threads(is_builtin(cfg.model))

    # 3. The model: the tokenizer renders every record, every distinct checkpoint shape loads onto the base.
    source = model_source(cfg.model, echo=echo)
    tok = load_tokenizer(cfg.model)
    longest = _check_tokenization(tok, data.pool + data.val, cfg)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_length": max(16, longest)})})
    store = RunStore(out)
    if store.exists():
        return _existing(store, cfg, data, runs, echo)
    parameters = _check_models(cfg, runs, echo)
    given = check_quantized(cfg, runs, given_specs, echo)  # the user's own quantized models: `ingest.quantized`
    cfg = with_quantizers(cfg, given)

    # 4. Digests of every checkpoint's defining files, then the store (data files first, the manifest last).
    echo("[import] recording the checkpoints' sha256 digests ...")
    imported = _imported_block(runs, files, heldout_path, request.record_format_option)
    if given:
        imported["quantized"] = [g.to_dict() for g in given]
    data_info = data_block(data, files, heldout_path, request.record_format_option, request.seed)
    data_info.update(max_train=request.max_train, max_heldout=request.max_heldout)
    _write_store(store, cfg, data, _StoreContent(data_info, imported, source.to_dict(), parameters))
    notes = data.notes + [n for r in runs for n in r.notes]
    n_train = [int(x) for x in data.masks.sum(1)]
    return ImportResult(store, cfg, runs, len(data.pool), len(data.val), n_train, True, notes, parameters)


def _write_store(store: RunStore, cfg: ExperimentConfig, data: ImportData, content: _StoreContent) -> None:
    """The store's files: the data files first, the manifest (with the parameter counts) last."""
    store.begin_create(cfg)
    atomic_write_text(store.root / "data" / "pool.jsonl", records_to_jsonl(data.pool))
    atomic_write_text(store.root / "data" / "val.jsonl", records_to_jsonl(data.val))
    device = pick_device(cfg.score.device)
    compute = {**choose_compute_dtype(cfg.model.dtype, device).to_record(), "device": device.type}
    manifest = store.create(
        cfg, content.data_info, data.masks, imported=content.imported, model_source=content.source, compute=compute
    )
    manifest["parameters"] = content.parameters
    store.write_manifest(manifest)


def _check_arguments(dirs: list[Path], files: list[Path], max_train: int | None, max_heldout: int | None) -> None:
    if not dirs:
        raise ImportInputError("no training output directory given: pass TRAINING_DIR (and --runs DIR for more runs).")
    if len(files) not in (1, len(dirs)):
        raise ImportInputError(
            f"{len(dirs)} training directories but {len(files)} --train files: give one --train FILE per run, "
            "in the same order as the directories (or one file that every run trained on)."
        )
    for option, value in (("--max-train", max_train), ("--max-heldout", max_heldout)):
        if value is not None and value < 1:
            raise ImportInputError(f"{option} must be a positive number of records; got {value}.")
    resolved = [d.resolve() for d in dirs]
    if len(set(resolved)) != len(resolved):
        raise ImportInputError(f"a training directory is given twice ({[str(d) for d in dirs]}); one per run.")


def _check_out_dir(out: Path, runs: list[TrainingOutput]) -> None:
    target = out.resolve()
    for output in runs:
        inside = [output.source, *(c.path for c in output.checkpoints)]
        if any(target == p or p in target.parents for p in inside):
            raise ImportInputError(
                f"--out {out} is inside the training output {output.source}; choose a new directory for the run store."
            )


def _check_overrides(overrides: Sequence[str]) -> None:
    """Refuse an override of a key the import sets from its inputs (SET_BY_IMPORT names the option to use)."""
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        forced = [k for k in SET_BY_IMPORT if k == key or k.startswith(key + ".")]
        if forced:
            raise RecipeError(
                f"override {text!r}: {forced[0]} is set by {SET_BY_IMPORT[forced[0]]} in `llmaudit import`."
            )


def _train_section(runs: list[TrainingOutput], masks: np.ndarray, seed: int) -> dict[str, Any]:
    """The config's train section: what the runs' trainers recorded (epochs, batch size, peak learning rate)."""
    trainers = [r.trainer for r in runs]
    fraction = min(max(round(float(masks.mean()), 6), 1e-6), 1 - 1e-6)
    train: dict[str, Any] = {"runs": len(runs), "member_fraction": fraction, "seed": seed}
    epochs = [_epochs(t) for t in trainers]
    train["epochs"] = max([e for e in epochs if e is not None], default=1)
    sizes = [t["train_batch_size"] for t in trainers if isinstance(t.get("train_batch_size"), int)]
    if sizes and min(sizes) >= 1:
        train["batch_size"] = max(sizes)
    rates = [t["learning_rate"]["max"] for t in trainers if "learning_rate" in t]
    if rates and max(rates) > 0:
        train["lr"] = float(max(rates))
    return train


def _config(request: ImportRequest, runs: list[TrainingOutput], data: ImportData) -> ExperimentConfig:
    """The store's experiment config: what the inputs say, plus the user's overrides of everything else."""
    _check_overrides(request.overrides)
    out, name, seed = Path(request.out), request.name, request.seed
    files = list(request.train_files)
    raw: dict[str, Any] = {
        "name": name or out.resolve().name,
        "output_dir": str(out),
        "model": {"name": request.base},
        "data": {
            "source": "local",
            "path": str(files[0]),
            "pool_size": len(data.pool),
            "val_size": len(data.val),
            "seed": seed,
        },
        "lora": _lora([r.trainer for r in runs]),
        "train": _train_section(runs, data.masks, seed),
    }
    raw = apply_overrides(raw, list(request.overrides))
    if request.trust_remote_code:
        raw.setdefault("model", {})["trust_remote_code"] = True
    if not name and not is_safe_name(str(raw.get("name"))):
        raise RecipeError(
            f"the experiment name defaults to the --out directory's name {raw.get('name')!r}, which is not a valid "
            f"name ({SAFE_NAME_RULE}); pass --name NAME."
        )
    cfg = config_from_dict(
        raw,
        source="(llmaudit import + overrides)",
        overrides=list(request.overrides),
        attack_names=request.attack_names,
    )
    missing = missing_reference(cfg.score.quantizers)
    if missing:
        raise RecipeError(missing)
    # Once more through JSON, as the store reads it back: defaults such as lora.alpha = 16 (an int in a float
    # field, not validated) become what validation makes of them, so the identity hash matches on reading.
    return config_from_dict(json.loads(cfg.model_dump_json()), source="(llmaudit import + overrides)")


def _epochs(trainer: dict) -> int | None:
    value = trainer.get("num_train_epochs")
    if isinstance(value, (int, float)) and value >= 1:
        return int(math.ceil(value))
    value = trainer.get("epoch")
    if isinstance(value, (int, float)) and value > 0:
        return max(1, int(math.ceil(value)))
    return None


def _lora(trainers: list[dict]) -> dict[str, Any]:
    """LoRA settings from the first adapter_config.json (LoraSettings' fields where valid)."""
    adapter = next((t["adapter"] for t in trainers if t.get("adapter")), None)
    if not adapter:
        return {}
    out: dict[str, Any] = {}
    if isinstance(adapter.get("r"), int) and adapter["r"] >= 1:
        out["r"] = adapter["r"]
    if isinstance(adapter.get("lora_alpha"), (int, float)) and adapter["lora_alpha"] > 0:
        out["alpha"] = float(adapter["lora_alpha"])
    if isinstance(adapter.get("lora_dropout"), (int, float)) and 0 <= adapter["lora_dropout"] < 1:
        out["dropout"] = float(adapter["lora_dropout"])
    modules = adapter.get("target_modules")
    if isinstance(modules, str):
        out["target_modules"] = [modules]
    elif isinstance(modules, list) and all(isinstance(m, str) for m in modules):
        out["target_modules"] = sorted(modules)
    return out


def _existing(
    store: RunStore, cfg: ExperimentConfig, data: ImportData, runs: list[TrainingOutput], echo
) -> ImportResult:
    """An output directory that already holds a store: the same import (nothing to do) or a refusal."""
    store.check_identity(cfg)  # another experiment: refused, naming what differs
    manifest = store.manifest()
    recorded_data = manifest.get("data", {})
    imported = manifest.get("imported") or {}
    pool, val, masks = data.pool, data.val, data.masks
    same = (
        recorded_data.get("fingerprint") == dataset_fingerprint(pool + val)
        and manifest["membership"]["masks"] == ["".join("1" if m else "0" for m in row) for row in masks]
        and [[c.get("path") for c in r.get("checkpoints", [])] for r in imported.get("runs", [])]
        == [[str(c.path) for c in r.checkpoints] for r in runs]
    )
    if not same:
        raise StoreError(
            f"output directory {store.root} already holds a run store of other data or checkpoints "
            f"(experiment {manifest.get('name')!r}); choose a new --out or delete that directory."
        )
    echo(f"[import] {store.root} already holds this import; nothing to do")
    recorded = store.config()
    return ImportResult(
        store,
        recorded,
        runs,
        len(pool),
        len(val),
        [int(x) for x in masks.sum(1)],
        False,
        [],
        dict(manifest.get("parameters") or {}),
    )


def _check_tokenization(tok: Any, records: list[dict], cfg: ExperimentConfig) -> int:
    """Every record renders with the base model's tokenizer (and scores at least one token); the longest."""
    longest = 0
    for rec in records:
        try:
            ids, mask, _ = format_record(tok, rec, include_prompt=cfg.data.include_prompt_in_loss)
        except Exception as exc:  # a chat template that rejects the messages, a tokenizer error
            raise ImportInputError(
                f"record {rec['sample_id']!r} (format {record_format(rec)}) cannot be tokenised by {cfg.model.name}'s "
                f"tokenizer ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                "check --format and the record."
            ) from None
        if not any(mask[1:]):
            raise ImportInputError(f"record {rec['sample_id']!r} has no token to score (an empty response).")
        longest = max(longest, len(ids))
    return longest


def _check_models(cfg: ExperimentConfig, runs: list[TrainingOutput], echo) -> dict[str, int]:
    """Load the base and, for every distinct (kind, weight shapes) among the checkpoints, one checkpoint onto
    it (`load_checkpoint_model` refuses a shape mismatch); returns the parameter counts for the manifest."""
    device = torch.device("cpu")
    echo(f"[import] loading the base model {cfg.model.name} to check that the checkpoints fit it ...")
    base = load_base_model(cfg.model, device, dtype=torch.bfloat16)  # half the memory: only shapes matter here
    import_gptqmodel_quietly()  # peft imports it when it wraps a model in LoRA layers
    model_total = count_parameters(base).total
    checked: dict[tuple, Checkpoint] = {}
    adapter_sizes = []
    for output in runs:
        for ckpt in output.checkpoints:
            shapes = weight_shapes(ckpt)
            if ckpt.kind == "lora":
                adapter_sizes.append(sum(math.prod(s) for s in shapes.values()))
            key = (ckpt.kind, tuple(sorted(shapes.items())))
            if key in checked:
                continue
            model = load_checkpoint_model(base, ckpt.path, device)
            del model
            gc.collect()
            checked[key] = ckpt
    del base
    gc.collect()
    echo(f"[import] {len(checked)} distinct checkpoint shape(s) load onto the base model")
    trainable = max(adapter_sizes) if adapter_sizes else model_total
    return {"adapter_trainable": int(trainable), "model_total": int(model_total)}


def _imported_block(runs: list[TrainingOutput], files: list[Path], heldout: Path, fmt: str) -> dict[str, Any]:
    digests: dict[Path, str] = {}

    def sha(path: Path) -> str:
        if path not in digests:
            digests[path] = file_digest(path)
        return digests[path]

    return {
        "runs": [
            {
                "source": str(output.source),
                "train_file": str(path),
                "train_sha256": sha(path),
                "checkpoints": [c.record() for c in output.checkpoints],
                "trainer": output.trainer,
                "notes": output.notes,
            }
            for output, path in zip(runs, files, strict=True)
        ],
        "heldout_file": str(heldout),
        "heldout_sha256": sha(heldout),
        "record_format": fmt,
        "trainer": runs[0].trainer,
    }


def describe_import(result: ImportResult) -> list[str]:
    """The lines `llmaudit import` prints: what was found and written."""
    lines = []
    for run, output in enumerate(result.runs):
        kinds = "/".join(sorted({c.kind for c in output.checkpoints}))
        steps = [c.step for c in output.checkpoints]
        lines.append(
            f"run {run}: {len(steps)} {kinds} checkpoint(s), steps {steps}, {result.n_train[run]} member(s) in the "
            f"pool ({output.source})"
        )
    members_any = result.store.membership().any(axis=0).sum() if result.store.exists() else None
    lines.append(
        f"pool: {result.pool_size} records ({members_any} trained on by some run, the rest held out); "
        f"validation: {result.val_size} held-out records"
    )
    lines += [f"note: {n}" for n in result.notes]
    return lines
