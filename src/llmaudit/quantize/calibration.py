"""Calibration text of the quantizers that fit themselves to text (GPTQ, AWQ, llama.cpp's importance matrix): where it
comes from, and the samples drawn from it.

Where it comes from is the option ``calibration_source`` of every calibrated quantizer (the recipe sets it for all of
them with ``score.calibration_source``; docs/science.md "Calibration text"):
- ``heldout`` (default): the store's validation records, which no run trained on (they are also the records the
  utility columns are measured on: a calibrated quantizer's KL on them is measured on its own calibration text);
- ``members``: the run's own training records (the base model's units: run 0's), i.e. what GPTQ calibrated on before
  the option existed (a record without the option means it);
- ``file``: a text file the user names (``score.calibration_file``: plain text, documents separated by a blank line,
  or JSONL with a ``text`` field), the same for every run; its sha256 is recorded with the quantizer.

The samples: ``calibration_samples`` texts drawn without replacement with ``seed`` (all of them when there are fewer),
each tokenized and truncated to ``calibration_max_length`` tokens, exactly as GPTQ's calibration draws them.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from pathlib import Path

from llmaudit.common.bounded import check_file, read_jsonl
from llmaudit.common.errors import UserError

from .base import Option, QuantizationError, choice, integer

CALIBRATION_SOURCES = ("heldout", "members", "file")
DEFAULT_CALIBRATION_SOURCE = "heldout"
LEGACY_CALIBRATION_SOURCE = "members"
"""What a store's record without ``calibration_source`` means: GPTQ calibrated on the run's training texts."""


def calibration_options(*, samples: int = 128, max_length: int = 512) -> dict[str, Option]:
    """The options of a quantizer that calibrates on text: its source, the number and length of the samples, the seed.

    Args:
        samples: the default number of calibration samples.
        max_length: the default length of a sample, in tokens.

    Returns:
        {option name: `Option`}.
    """
    return {
        "calibration_source": choice(DEFAULT_CALIBRATION_SOURCE, CALIBRATION_SOURCES),
        "calibration_samples": integer(samples, "a positive int", lambda n: n > 0),
        "calibration_max_length": integer(max_length, "a positive int (tokens)", lambda n: n > 0),
        "seed": integer(0, "an int", lambda s: True),
    }


def calibration_token_ids(name: str, options: dict, tokenizer, texts: Sequence[str] | None) -> list[list[int]]:
    """The calibration samples (token ids) of a quantizer, drawn from the texts as its options say.

    Args:
        name: the quantizer's name (quoted by the error).
        options: its resolved options (``calibration_samples``, ``calibration_max_length``, ``seed``).
        tokenizer: the checkpoint's tokenizer.
        texts: the calibration texts.

    Returns:
        One list of token ids per sample.

    Raises:
        QuantizationError: the tokenizer or the texts are missing, no text is a non-empty string, or a text
            tokenizes to no token.
    """
    if tokenizer is None or not texts:
        raise QuantizationError(
            f"{name}: this quantizer calibrates on text and needs tokenizer= and calibration_texts= (the score stage "
            f"passes those of calibration_source={options.get('calibration_source')!r}); fix: pass both to quantize_model"
        )
    usable = [t for t in texts if isinstance(t, str) and t.strip()]
    if not usable:
        raise QuantizationError(f"{name}: the calibration texts hold no non-empty string")
    chosen = random.Random(options["seed"]).sample(usable, min(options["calibration_samples"], len(usable)))
    samples = []
    for text in chosen:
        ids = list(tokenizer(text, truncation=True, max_length=options["calibration_max_length"])["input_ids"])
        if not ids:
            raise QuantizationError(f"{name}: a calibration text tokenizes to no token: {text[:60]!r}")
        samples.append(ids)
    return samples


MAX_CALIBRATION_FILE_BYTES = 256 * 2**20
"""A calibration file is read whole: 256 MiB is far more text than 128 samples of 512 tokens need."""


def read_calibration_file(path: str | Path | None) -> tuple[list[str], str]:
    """The texts of a calibration file: JSONL (``.jsonl``: every line an object with a non-empty string ``text``) or
    plain text (anything else: documents separated by one or more blank lines).

    Args:
        path: the file (the command line names it; a run directory never does).

    Returns:
        (texts, sha256 of the file).

    Raises:
        UserError: no file is named, or it cannot be read or holds no text (the message names the file and the fix).
    """
    if path is None:
        raise UserError(
            "calibration_source=file needs score.calibration_file=PATH on the command line (a run directory records "
            "which file its quantizers calibrated on, by sha256, but never makes llmaudit read a file it names)"
        )
    path = Path(path).expanduser()
    fix = "score.calibration_file must name a UTF-8 text file (documents separated by blank lines) or JSONL with 'text'"
    try:
        check_file(path, limit=MAX_CALIBRATION_FILE_BYTES, what="calibration file")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if path.suffix == ".jsonl":
            texts = []
            for where, row in read_jsonl(path, what="calibration file"):
                if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
                    raise UserError(f"{where}: a calibration JSONL line needs a non-empty string 'text'; {fix}.")
                texts.append(row["text"])
        else:
            texts = [t.strip() for t in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if t.strip()]
    except FileNotFoundError:
        raise UserError(f"calibration file {path} does not exist; {fix}.") from None
    except UnicodeDecodeError:
        raise UserError(f"calibration file {path} is not UTF-8 text; {fix}.") from None
    if not texts:
        raise UserError(f"calibration file {path} holds no text; {fix}.")
    return texts, digest
