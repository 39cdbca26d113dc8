"""Several local processes on one stage, the machine's cores divided among them: `train.processes` fine-tuning
processes split a store's runs, `score.processes` scoring processes share its units (each unit is claimed with a
file lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from llmaudit.common.children import child_environment
from llmaudit.common.errors import UserError
from llmaudit.common.runtime import THREADS_ENV, env_threads, threads_per_process
from llmaudit.config import ExperimentConfig
from llmaudit.finetune.distributed import launched_processes
from llmaudit.finetune.runs import build_base, finetune, prepare_runs
from llmaudit.models.builtin import is_builtin
from llmaudit.score.stage import check_scoring
from llmaudit.store.run_store import RunStore


def score_in_processes(
    cfg: ExperimentConfig, store: RunStore, *, echo=print, deep_verify: bool = False, refresh_utility: bool = False
) -> dict[str, Any]:
    """Run `cfg.score.processes` `llmaudit score RUN_DIR --shard 0/1` processes at once and wait for them all.

    Each child scores the whole grid (shard 0 of 1; the unit locks share it out) with the same settings,
    `score.processes` included, so the store keeps recording the setting the user chose.

    Args:
        cfg: the experiment's config.
        store: its run store.
        echo: where progress lines go.
        deep_verify: each child reads every finished unit in full (`llmaudit score --deep-verify`).
        refresh_utility: each child rescores stale utility columns (`llmaudit score --refresh-utility`).

    Returns:
        {"processes": how many ran, "seconds": the wall time}.

    Raises:
        UserError: a child process failed (the exit codes named; its error is printed above).
    """
    check_scoring(cfg, store)  # a refused device, quantizer or store answers here, not from every child
    n = cfg.score.processes
    threads = threads_per_process(n)
    # the same score settings in every child (JSON is YAML); --shard keeps a child from starting processes
    settings = cfg.score.model_dump(mode="json")
    # options of a quantizer the grid does not score are unused: a child given them on its command line refuses them
    settings["quantizer_options"] = {
        q: o for q, o in settings["quantizer_options"].items() if q in settings["quantizers"] + settings["if_available"]
    }
    overrides = [f"score.{k}={json.dumps(v)}" for k, v in settings.items()]
    command = [
        sys.executable,
        "-m",
        "llmaudit.cli",
        "score",
        str(store.root),
        *overrides,
        "--shard",
        "0/1",
        "--no-progress",
    ]
    command += ["--deep-verify"] * deep_verify + ["--refresh-utility"] * refresh_utility
    command += ["--trust-remote-code"] * cfg.model.trust_remote_code
    echo(f"[score] {n} scoring processes with {threads} thread(s) each share the units of {store.root}")
    return _run_children([command] * n, threads, "scoring", "finished units are kept")


def finetune_stage(
    cfg: ExperimentConfig,
    recipe: str | None,
    overrides: list[str],
    *,
    shard: tuple[int, int] | None,
    show_progress: bool,
    echo=print,
) -> RunStore:
    """The fine-tuning stage of `llmaudit finetune` and `audit`: in `train.processes` child processes when the
    setting asks for several and this process is neither a shard nor one of a launcher's processes, else here.

    Args:
        cfg: the experiment's config.
        recipe: the recipe as the command line named it (None: the default one).
        overrides: the command line's key=value overrides.
        shard: this process's shard (`--shard K/N`), or None.
        show_progress: progress bars (in this process only; children print lines).
        echo: where progress lines go.

    Returns:
        The run store, every run of the shard trained.
    """
    if cfg.train.processes > 1 and shard is None and launched_processes() == 1:
        store, todo = prepare_runs(cfg, echo=echo)
        if todo:  # the base model is built here while the children start (they wait for it)
            finetune_in_processes(cfg, store, recipe, overrides, echo=echo, meanwhile=lambda: build_base(cfg))
        return store
    return finetune(cfg, shard=shard, progress=show_progress, echo=echo)


def finetune_in_processes(
    cfg: ExperimentConfig,
    store: RunStore,
    recipe: str | None,
    overrides: list[str],
    *,
    echo=print,
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run `cfg.train.processes` `llmaudit finetune RECIPE --out RUN_DIR --shard K/N` processes at once and wait.

    Each child trains its round-robin share of the runs (the runs are of equal size, so the shares take equal
    time), whole and in order, with its share of the cores: a run is trained as one process would train it.
    The caller has created the store first (`finetune.runs.prepare_runs`).

    Args:
        cfg: the experiment's config.
        store: its run store, already created.
        recipe: the recipe as the command line named it (None: the default one).
        overrides: the command line's key=value overrides.
        echo: where progress lines go.
        meanwhile: run in this process once the children are started (the base model's build); when it fails,
            the children are stopped and its error raised.

    Returns:
        {"processes": how many ran, "seconds": the wall time}.

    Raises:
        UserError: a child process failed (the exit codes named; its error is printed above).
    """
    n = min(cfg.train.processes, cfg.train.runs)
    # a built-in model trains on one thread wherever it runs (`configure_threads`), so its runs stay the same
    threads = None if is_builtin(cfg.model) and env_threads() is None else threads_per_process(n)
    base = [sys.executable, "-m", "llmaudit.cli", "finetune", *([recipe] if recipe else []), *overrides]
    base += ["--out", str(store.root), "--no-progress"]  # model.trust_remote_code, if given, is in the overrides
    echo(f"[finetune] {n} processes with {threads or 1} thread(s) each train the runs of {store.root}")
    commands = [[*base, "--shard", f"{k}/{n}"] for k in range(n)]
    return _run_children(commands, threads, "fine-tuning", "finished runs are kept", meanwhile=meanwhile)


def _run_children(
    commands: list[list[str]], threads: int | None, what: str, kept: str, meanwhile: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Start every command at once with `threads` CPU threads each (None: the child's own choice), run `meanwhile`
    here (the children stopped if it fails), wait for all; UserError when one failed."""
    env = child_environment(dict(os.environ, **({THREADS_ENV: str(threads)} if threads else {})))
    t0 = time.time()
    procs = [subprocess.Popen(command, env=env) for command in commands]
    try:
        if meanwhile is not None:
            meanwhile()
    except BaseException:
        for p in procs:
            p.terminate()
            p.wait()
        raise
    codes = [p.wait() for p in procs]
    if any(codes):
        raise UserError(
            f"{sum(1 for c in codes if c)} of {len(codes)} {what} processes failed (exit codes {codes}); their errors "
            f"are above. Run the same command again: {kept}."
        )
    return {"processes": len(codes), "seconds": time.time() - t0}
