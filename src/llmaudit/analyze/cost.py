"""What the analysis costs on this machine: `run_attacks` (every attack of a recipe, its bootstrap intervals and the
release decision) timed on small synthetic loss tables and scaled to an experiment's size.

The report stage runs on the CPU whatever device scored the models. Its cost per quantizer has three parts,
each measured at the experiment's number of runs (every run is a target whose references are the other runs, so
the work grows with runs x runs x records and is measured at the runs it will have) and two small numbers of
pool records n:

- fixed(n): the scores, the point estimates and the calibration (`n_boot = 0`, no decision);
- per_boot(n): one more bootstrap resample of every attack's intervals ((t(n_boot = b) - fixed) / b);
- per_decision(n): one more resample of the release decision ((t(200 decision resamples) - fixed) / 200).

Each part is modelled as c(n) = a + b x n, fitted through the two sizes (a, b >= 0): a is the per-call overhead
that does not grow (Python dispatch per attack and resample, which dominates at small sizes), b x n the work
(the scores are sorted once and every resample cumulates weights over that order, so a resample's work is
linear in n; the one sort per evaluation is a small part of the fixed cost). Scaling the measured seconds by a
power of n instead would scale the overhead with the work and overstate a large grid by orders of magnitude.
Checked against the analysis timed at 5x and 10x the larger size measured (docs/science.md, "What the report
stage costs"). An experiment of Q quantizers, n pool records, B bootstrap and D decision resamples costs
Q x [fixed(n) + B x per_boot(n) + D x per_decision(n)] seconds.

Beside the attacks the report reads the store's loss tables (`read_cost`: seconds per unit file and per byte,
measured by writing the larger table as unit files and reading it back) and decides each release set (1 + k
decisions of a set of k files, each priced as one quantizer's decision resamples): `report_rest_seconds`.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from ..store.losstable import read_loss_table, validate_loss_table, write_loss_table
from .attacks.evaluate import run_attacks
from .attacks.settings import AttackRunSettings
from .decision import DecisionSettings
from .roc_kernel import warm_up

DECISION_RESAMPLES = 200
"""Decision resamples of the measurement: enough that their work stands out of the timing noise at the sizes
measured (at 50 the slope was lost in it); the decision's one-off work (the observed row, the choice) is
counted in its per-resample cost, which errs on the side of a longer plan."""


def synthetic_loss_table(runs: int, records: int, quantizers: int, seed: int = 0) -> pd.DataFrame:
    """Make a loss table with what every attack reads, for timing the analysis.

    The table holds `records` pool texts (20 to 120 tokens) and records / 5 validation texts, the base model (run -1)
    and `runs` fine-tuned runs under each quantizer (the first is fp32: no quantization change), each run training
    on half the pool; members' losses are lowered on a third of their tokens.

    Args:
        runs (int): fine-tuned runs.
        records (int): pool records.
        quantizers (int): quantizers, the first fp32.
        seed (int): the generator's seed.
    Returns:
        pd.DataFrame: the validated loss table.
    """
    rng = np.random.default_rng(seed)
    n_val = max(records // 5, 2)
    ids = [f"p{j}" for j in range(records)] + [f"v{j}" for j in range(n_val)]
    lengths = rng.integers(20, 121, len(ids))
    base = [rng.lognormal(0.0, 0.6) * rng.gamma(2.0, 0.5, n) for n in lengths]
    keep = rng.random((runs, records)) < 0.5
    rows = []
    for q in ["fp32", *(f"q{k}" for k in range(1, quantizers))]:
        change = [rng.normal(0, 0.3, n) * (q != "fp32") for n in lengths]
        for run in range(-1, runs):
            for j, sid in enumerate(ids):
                member = bool(run >= 0 and j < records and keep[run, j])
                tl = np.maximum(base[j] + change[j] + rng.normal(0, 0.2, lengths[j]), 0)
                if member:
                    tl = tl * np.where(rng.random(lengths[j]) < 1 / 3, 0.5, 1.0)
                rows.append(_row(run, q, sid, "pool" if j < records else "val", member, tl.astype(np.float32)))
    return validate_loss_table(pd.DataFrame(rows))


def _row(run: int, quantizer: str, sample: str, split: str, member: bool, tl: np.ndarray) -> dict:
    return {
        "run": run,
        "checkpoint": 0 if run < 0 else 10,
        "quantizer": quantizer,
        "sample_id": sample,
        "split": split,
        "member": member,
        "loss": float(tl.mean()),
        "n_tokens": int(tl.size),
        "token_losses": tl,
        "token_top1": tl < 0.25,
        "token_vocab_mean": (-1.5 * tl).astype(np.float32),  # the mean of log p under the model: 0 at loss 0
        "token_vocab_std": np.full(tl.size, 1.5, np.float32),
        "zlib_bytes": int(4 * tl.size),
    }


@dataclass(frozen=True)
class CostModel:
    """c(n) = overhead_s + per_record_s x n (seconds per quantizer, n pool records)."""

    overhead_s: float
    per_record_s: float

    def at(self, n: float) -> float:
        """Evaluate the cost at a number of pool records.

        Args:
            n (float): pool records.
        Returns:
            float: seconds per quantizer.
        """
        return self.overhead_s + self.per_record_s * float(n)


def fit_cost(n: Sequence[float], seconds: Sequence[float]) -> CostModel:
    """Fit the line a + b x n through the first and the last point with a, b >= 0.

    A negative slope (timing noise) becomes a constant at the larger size's seconds, a negative intercept a line
    through the origin and the larger size.

    Args:
        n (Sequence[float]): the sizes measured, ascending.
        seconds (Sequence[float]): the seconds at each size.
    Returns:
        CostModel: the fitted line.
    """
    x0, x1, y0, y1 = float(n[0]), float(n[-1]), max(seconds[0], 0.0), max(seconds[-1], 0.0)
    slope = (y1 - y0) / (x1 - x0) if x1 > x0 else 0.0
    if slope <= 0:
        return CostModel(y1, 0.0)
    intercept = y1 - slope * x1
    return CostModel(intercept, slope) if intercept >= 0 else CostModel(0.0, y1 / x1)


@dataclass(frozen=True)
class AnalysisCost:
    """The three parts of the analysis's cost per quantizer, each a `CostModel` in pool records, fitted on tables
    of `runs` runs and `records` pool records."""

    fixed: CostModel
    per_boot: CostModel
    per_decision: CostModel
    runs: int
    records: tuple[int, ...]
    attacks: tuple[str, ...]
    measured_in_s: float
    read_per_file_s: float = 0.0
    """Seconds to read and validate one unit file beside its bytes (`read_cost`); 0 = not measured."""
    read_per_byte_s: float = 0.0
    """Seconds per loss-table byte read and validated (`read_cost`)."""

    def as_dict(self) -> dict:
        """Write the cost as a JSON-ready dict.

        Returns:
            dict: every field.
        """
        return asdict(self)


def _seconds(df: pd.DataFrame, attacks: tuple[str, ...], n_boot: int, decision: int) -> float:
    """CPU seconds of this process (other processes on a shared machine do not count; the analysis runs in one
    thread, so they are its wall seconds on an idle machine)."""
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synthetic table's own oddities (e.g. LiRA's normality check)
        settings = DecisionSettings(resamples=decision, seed=0) if decision else None
        run_attacks(df, AttackRunSettings(attacks=attacks, n_boot=n_boot, seed=0), decision=settings)
    return time.process_time() - start


def measure_analysis_cost(
    attacks: Sequence[str], *, runs: int, records: Sequence[int] = (200, 800), resamples: int = 200
) -> AnalysisCost:
    """Time the analysis of some attacks on synthetic tables and fit its three parts per quantizer.

    Each table has `runs` runs, one of the `records` sizes and 2 quantizers; the analysis is timed without
    resamples, with `resamples` bootstrap resamples and with DECISION_RESAMPLES decision resamples, in CPU seconds
    of this process (`_seconds`) with one BLAS/OpenMP thread, as a report worker has on a machine it fills (idle
    pool threads that spin between calls would count as work). The larger table is then written as unit files and
    read back as the report reads a store's (`read_cost`).

    Args:
        attacks (Sequence[str]): the attacks timed.
        runs (int): the experiment's number of runs.
        records (Sequence[int]): the two pool sizes measured.
        resamples (int): bootstrap resamples of the timing.
    Returns:
        AnalysisCost: the fixed, per-bootstrap and per-decision cost models.
    """
    started = time.perf_counter()
    warm_up()  # the compiled bootstrap pass, compiled before anything is timed
    attacks = tuple(attacks)
    sizes, fixed, boot, dec = [], [], [], []
    quantizers = 2
    with threadpool_limits(limits=1):
        for n_records in records:
            df = _measure_size(runs, n_records, quantizers, attacks, resamples, (sizes, fixed, boot, dec))
        per_file, per_byte = read_cost(df)
    return AnalysisCost(
        read_per_file_s=per_file,
        read_per_byte_s=per_byte,
        fixed=fit_cost(sizes, fixed),
        per_boot=fit_cost(sizes, boot),
        per_decision=fit_cost(sizes, dec),
        runs=runs,
        records=tuple(sizes),
        attacks=attacks,
        measured_in_s=time.perf_counter() - started,
    )


def _measure_size(
    runs: int, n_records: int, quantizers: int, attacks: tuple, resamples: int, into: tuple
) -> pd.DataFrame:
    """One size of `measure_analysis_cost`: appends the size and its three parts per quantizer to `into`; returns the
    table it timed."""
    sizes, fixed, boot, dec = into
    df = synthetic_loss_table(runs, n_records, quantizers)
    base = _seconds(df, attacks, 0, 0)
    sizes.append(n_records)
    fixed.append(base / quantizers)
    boot.append(max(_seconds(df, attacks, resamples, 0) - base, 0.0) / resamples / quantizers)
    dec.append(max(_seconds(df, attacks, 0, DECISION_RESAMPLES) - base, 0.0) / DECISION_RESAMPLES / quantizers)
    return df


def analysis_seconds(
    cost: AnalysisCost, *, pool: int, quantizers: int, n_boot: int, decision_resamples: int, processes: int = 1
) -> float:
    """Predict the analysis's seconds: ceil(Q / P) x [fixed(n) + B x per_boot(n) + D x per_decision(n)].

    The quantizers are attacked P at a time (`report.processes`, on as many cores); the cost holds for the runs it
    was measured at (module docstring).

    Args:
        cost (AnalysisCost): the measured cost.
        pool (int): pool records n.
        quantizers (int): quantizers Q.
        n_boot (int): bootstrap resamples B.
        decision_resamples (int): decision resamples D.
        processes (int): worker processes P.
    Returns:
        float: the seconds.
    """
    n = max(pool, 1)
    per_quantizer = (
        cost.fixed.at(n) + max(n_boot, 0) * cost.per_boot.at(n) + max(decision_resamples, 0) * cost.per_decision.at(n)
    )
    return -(-quantizers // max(processes, 1)) * per_quantizer


def _timed_read(df: pd.DataFrame, keys: list[str], tmp: Path) -> tuple[int, int, float]:
    """``df`` written as one parquet file per group of ``keys`` (helper columns dropped), then read back with
    `read_loss_table`: (files, bytes, CPU seconds of the read)."""
    tmp.mkdir()
    for n, (_, unit) in enumerate(df.groupby(keys, sort=True)):
        write_loss_table(unit.drop(columns=["_part"]).reset_index(drop=True), tmp / f"unit{n}.parquet")
    files = list(tmp.glob("*.parquet"))
    start = time.process_time()
    read_loss_table(tmp)
    return len(files), sum(f.stat().st_size for f in files), time.process_time() - start


def read_cost(df: pd.DataFrame, parts: int = 10) -> tuple[float, float]:
    """What reading and validating a store's loss tables costs on this machine, per unit file and per byte: ``df``
    written as one file per (run, quantizer), as a store holds its units, then in `parts` times as many smaller
    files, each layout read back with `read_loss_table`; the two readings t = files x a + bytes x b give the two
    parts (each >= 0).

    Args:
        df (pd.DataFrame): a validated loss table (`synthetic_loss_table`).
        parts (int): the smaller files per unit of the second layout.
    Returns:
        tuple[float, float]: (seconds per file, seconds per byte).
    """
    units = df.groupby(["run", "quantizer"], sort=True)
    rows = max(int(units.size().max()) // parts, 1)
    df = df.assign(_part=units.cumcount() // rows)
    with tempfile.TemporaryDirectory(prefix="llmaudit-read-cost-") as tmp:
        f1, b1, t1 = _timed_read(df, ["run", "quantizer"], Path(tmp) / "units")
        f2, b2, t2 = _timed_read(df, ["run", "quantizer", "_part"], Path(tmp) / "parts")
    det = f1 * b2 - f2 * b1
    per_file = max((t1 * b2 - t2 * b1) / det, 0.0) if det else 0.0
    return per_file, max(t1 - f1 * per_file, 0.0) / b1


def report_rest_seconds(
    cost: AnalysisCost, *, pool: int, files: int, table_bytes: int, set_sizes: Sequence[int], resamples: int
) -> float:
    """The report's measured work beside the attacks: reading the store's loss tables, and each release set's
    decisions (the set's own and one per file on the set's records, `release_sets.decide_release_set`), each priced
    as one quantizer's decision resamples.

    Args:
        cost (AnalysisCost): the measured cost.
        pool (int): pool records n.
        files (int): the store's unit files.
        table_bytes (int): their bytes.
        set_sizes (Sequence[int]): the files of each release set.
        resamples (int): decision resamples D.
    Returns:
        float: the seconds.
    """
    read = files * cost.read_per_file_s + table_bytes * cost.read_per_byte_s
    decisions = sum(1 + k for k in set_sizes)
    return read + decisions * max(resamples, 0) * cost.per_decision.at(max(pool, 1))
