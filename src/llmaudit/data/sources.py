"""SMolInstruct records: loading (hub data.zip, local files, offline generator), validation, fingerprints,
and formatting into token ids with response-only loss masks.

`datasets` 4+ refuses the hub's loading script, so the hub route downloads `data.zip` and joins its files
the way the script does (see docs/architecture.md, "Data sources"): raw rows + instruction templates + sample selection
+ core tags.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Literal

from llmaudit.common.bounded import MAX_JSONL_BYTES, check_file, parse_json
from llmaudit.config import DataConfig
from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
from llmaudit.data.records import DataError, read_record_file, validate_record

DataRoute = Literal["synthetic", "hub", "local-zip", "local-smolinstruct-dir", "local-files"]


def resolve_route(cfg: DataConfig) -> DataRoute:
    """Which loading branch a data config takes (no I/O beyond inspecting a local path)."""
    if cfg.source == "synthetic":
        return "synthetic"
    if cfg.source == "hub":
        return "hub"
    path = Path(cfg.path or "")
    if not path.exists():
        raise DataError(
            f"data.path={cfg.path!s} does not exist. Point it to SMolInstruct's data.zip, its extracted "
            "directory, or JSONL/parquet files with the fields input, output, task."
        )
    if path.is_file() and path.suffix == ".zip":
        return "local-zip"
    if path.is_dir() and (path / "raw").is_dir() and (path / "sample").is_dir():
        return "local-smolinstruct-dir"
    if path.is_dir() and (path / "data" / "raw").is_dir():
        return "local-smolinstruct-dir"
    return "local-files"


def load_records(cfg: DataConfig, *, n_needed: int | None = None) -> tuple[list[dict], DataRoute]:
    """All records of cfg.tasks in cfg.hub_split from the configured source, validated."""
    route = resolve_route(cfg)
    if route == "synthetic":
        unsupported = [t for t in cfg.tasks if t not in SUPPORTED_TASKS]
        if unsupported:
            raise DataError(
                f"the offline generator only makes {list(SUPPORTED_TASKS)}; data.tasks has {unsupported}. "
                "Use data.source=hub or local for other tasks."
            )
        n = n_needed or (cfg.pool_size + cfg.val_size)
        # a margin, since records longer than max_length are dropped later
        recs = generate_records(cfg.tasks, int(n * 1.25) + 8, seed=cfg.seed, stream="audit")
        return [validate_record(r, "generator") for r in recs], route
    if route == "hub":
        zip_path = download_smolinstruct_zip(cfg.hub_id)
        return read_smolinstruct_zip(zip_path, cfg.tasks, cfg.hub_split), route
    path = Path(cfg.path)  # type: ignore[arg-type]
    if route == "local-zip":
        return read_smolinstruct_zip(path, cfg.tasks, cfg.hub_split), route
    if route == "local-smolinstruct-dir":
        root = path / "data" if (path / "data" / "raw").is_dir() else path
        return read_smolinstruct_tree(_DirTree(root), cfg.tasks, cfg.hub_split), route
    files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".parquet")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path}: no .jsonl or .parquet files found.")
    records = [r for f in files for r in read_record_file(f)]
    keep = [r for r in records if r["task"] in cfg.tasks and r["split"] in (cfg.hub_split, "")]
    if not keep:
        found = sorted({(r["task"], r["split"]) for r in records})
        raise DataError(f"{path}: no records with task in {cfg.tasks} and split {cfg.hub_split!r}; found {found[:10]}.")
    return keep, route


def download_smolinstruct_zip(hub_id: str) -> Path:
    """Download (or reuse from the hub cache) SMolInstruct's data.zip."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=hub_id, filename="data.zip", repo_type="dataset"))
    except Exception as exc:  # offline mode, no network, missing repo: all end here
        raise DataError(
            f"could not get data.zip of {hub_id} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            "Offline? Download it once elsewhere and set data.source=local data.path=/path/to/data.zip, "
            "or use data.source=synthetic for the offline stand-in."
        ) from exc


class _DirTree:
    def __init__(self, root: Path):
        self.root = root

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def read(self, rel: str) -> str:
        check_file(self.root / rel, limit=MAX_JSONL_BYTES, what="SMolInstruct file")
        return (self.root / rel).read_text(encoding="utf-8")


class _ZipTree:
    def __init__(self, zf: zipfile.ZipFile):
        self.zf = zf
        names = zf.namelist()
        # data.zip stores everything under a top folder ("data/"); find it from raw/
        prefix = ""
        for name in names:
            i = name.find("raw/")
            if i >= 0:
                prefix = name[:i]
                break
        self.prefix = prefix
        self.names = set(names)

    def exists(self, rel: str) -> bool:
        return self.prefix + rel in self.names

    def read(self, rel: str) -> str:
        size = self.zf.getinfo(self.prefix + rel).file_size  # a member's declared size: no zip bomb lands in memory
        if size > MAX_JSONL_BYTES:
            raise DataError(f"SMolInstruct file {rel} in data.zip expands to {size:,} bytes; download data.zip again.")
        return self.zf.read(self.prefix + rel).decode("utf-8")


def read_smolinstruct_zip(path: Path, tasks: list[str], split: str) -> list[dict]:
    try:
        with zipfile.ZipFile(path) as zf:
            return read_smolinstruct_tree(_ZipTree(zf), tasks, split)
    except zipfile.BadZipFile as exc:
        raise DataError(f"{path} is not a valid zip file ({exc}); download data.zip again.") from exc


def read_smolinstruct_tree(tree: Any, tasks: list[str], split: str) -> list[dict]:
    """Join raw rows, templates, sample selections and core tags as SMolInstruct's loading script does."""
    records: list[dict] = []
    for task in tasks:
        raw_rel = f"raw/{split}/{task}.jsonl"
        sample_rel = f"sample/instruction_tuning/{split}/{task}.json"
        for rel in (raw_rel, sample_rel, f"core_tag/{task}.json"):
            if not tree.exists(rel):
                raise DataError(f"SMolInstruct file {rel} is missing; is this the full data.zip (v1.3)?")
        raw_rows = []
        for lineno, line in enumerate(tree.read(raw_rel).splitlines(), 1):
            if line.strip():
                try:
                    raw_rows.append(parse_json(line, f"{raw_rel}:{lineno}"))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{raw_rel}:{lineno}: malformed JSON ({exc.msg})") from None
        selection = parse_json(tree.read(sample_rel), sample_rel)
        tags = parse_json(tree.read(f"core_tag/{task}.json"), f"core_tag/{task}.json")
        template_rel = f"template/{selection['template_name']}/{task}.json"
        if not tree.exists(template_rel):
            raise DataError(f"SMolInstruct template file {template_rel} is missing.")
        templates = parse_json(tree.read(template_rel), template_rel)
        in_l, in_r = tags["input"]
        out_l, out_r = tags["output"]
        for sample in selection["samples"]:
            idx = int(sample["idx"])
            if idx >= len(raw_rows):
                raise DataError(f"{sample_rel}: sample idx {idx} beyond the {len(raw_rows)} rows of {raw_rel}")
            row = raw_rows[idx]
            tmpl = templates[int(sample["template_id"])]
            core_in = f"{in_l} {row['input']} {in_r}" if (in_l or in_r) else row["input"]
            core_out = f"{out_l} {row['output']} {out_r}" if (out_l or out_r) else row["output"]
            rec = {
                "input": tmpl["input"].replace("<INPUT>", core_in),
                "output": tmpl["output"].replace("<OUTPUT>", core_out),
                "raw_input": row["input"],
                "raw_output": row["output"],
                "split": split,
                "task": task,
                "input_core_tag_left": in_l,
                "input_core_tag_right": in_r,
                "output_core_tag_left": out_l,
                "output_core_tag_right": out_r,
                "target": sample.get("target", row["output"]),
                "sample_id": f"{task}/{split}/{idx}",
            }
            records.append(validate_record(rec, f"{raw_rel}: idx {idx}"))
    return records
