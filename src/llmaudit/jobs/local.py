"""Several local processes on one stage: `score.processes` scoring processes share one store's units
(each unit is claimed with a file lock), the machine's cores divided among them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from llmaudit.common.errors import UserError
from llmaudit.common.runtime import THREADS_ENV, available_cores, env_threads
from llmaudit.config import ExperimentConfig
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
    n = cfg.score.processes
    threads = max(1, (env_threads() or available_cores()) // n)
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
    env = dict(os.environ, **{THREADS_ENV: str(threads)})
    echo(f"[score] {n} scoring processes with {threads} thread(s) each share the units of {store.root}")
    t0 = time.time()
    procs = [subprocess.Popen(command, env=env) for _ in range(n)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise UserError(
            f"{sum(1 for c in codes if c)} of {n} scoring processes failed (exit codes {codes}); their errors are above. Run the same command again: finished units are kept."
        )
    return {"processes": n, "seconds": time.time() - t0}
