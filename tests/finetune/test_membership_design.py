"""The membership design of the fine-tuning stage (train.membership): fixed-size subsets as before, or every pool
sample in every run independently; recorded in the store's manifest, and read back by the question whether the
one-run epsilon bound applies (docs/science.md section 15)."""

from __future__ import annotations

import numpy as np
import pytest

from llmaudit.analyze.epsilon_bound import inclusion_design
from llmaudit.config import RecipeError, load_recipe
from llmaudit.data.pool import membership_masks
from llmaudit.data.records import DataError
from llmaudit.finetune.experiment import draw_experiment
from llmaudit.models.builtin import builtin_tokenizer
from llmaudit.models.sources import ModelSource
from llmaudit.store.run_store import RunStore
from tests.conftest import TINY_OVERRIDES


def test_the_default_design_is_the_fixed_size_subset_it_always_was():
    masks = membership_masks(40, 6, 0.5, seed=2)
    assert np.array_equal(masks, membership_masks(40, 6, 0.5, seed=2, design="fixed_fraction"))
    assert (masks.sum(axis=1) == 20).all()
    with pytest.raises(ValueError, match="membership design"):
        membership_masks(40, 6, 0.5, seed=2, design="poisson")


def test_independent_inclusion_draws_each_sample_in_each_run_with_the_fraction_independently():
    runs, pool = 40, 500
    masks = membership_masks(pool, runs, 0.5, seed=3, design="independent")
    assert np.array_equal(masks, membership_masks(pool, runs, 0.5, seed=3, design="independent"))  # seeded
    counts = masks.sum(axis=1)
    assert len(set(counts.tolist())) > 5  # the size of a run's training set varies: not a fixed-size subset
    assert abs(masks.mean() - 0.5) < 4 * np.sqrt(0.25 / masks.size)
    # Pairs of runs and pairs of samples are uncorrelated (independent Bernoulli(1/2) draws): with a fixed-size
    # subset two samples of one run are negatively correlated by -1 / (pool - 1), here 0 within noise.
    centred = masks - masks.mean()
    within_run = (centred[:, :-1] * centred[:, 1:]).mean() / masks.var()
    assert abs(within_run) < 4 / np.sqrt(masks.size)
    assert abs(np.corrcoef(masks[0], masks[1])[0, 1]) < 4 / np.sqrt(pool)
    # Adding runs keeps the earlier runs' draws (run r reads only (seed, r)).
    assert np.array_equal(membership_masks(pool, 3, 0.5, seed=3, design="independent"), masks[:3])
    low = membership_masks(pool, runs, 0.2, seed=3, design="independent")
    assert abs(low.mean() - 0.2) < 4 * np.sqrt(0.16 / low.size)


def test_independent_inclusion_refuses_a_run_without_a_member_or_non_member_rather_than_redraw():
    with pytest.raises(DataError, match="every run needs a member and a non-member; raise data.pool_size"):
        membership_masks(1, 2, 0.5, seed=0, design="independent")


def _draw(cfg):
    return draw_experiment(
        cfg, echo=lambda *_: None, source=ModelSource(cfg.model.name, "standin"), tokenizer=builtin_tokenizer(cfg.model)
    )


def test_the_store_records_the_design_and_the_epsilon_bound_reads_it(tmp_path):
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={tmp_path / 'a'}", "train.membership=independent"])
    draw = _draw(cfg)
    assert np.array_equal(draw.masks, membership_masks(16, 3, 0.5, cfg.train.seed, design="independent"))
    store = RunStore(cfg.resolved_output_dir())
    manifest = store.create(cfg, draw.data_info, draw.masks)
    assert manifest["identity"]["train"]["membership"] == "independent"
    assert store.config().train.membership == "independent"  # the recorded config reads back with its identity
    assert inclusion_design(manifest).qualifies

    default = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={tmp_path / 'b'}"])
    assert "membership" not in default.identity()["train"]  # stores made before the design keep their identity
    assert default.identity_hash() != cfg.identity_hash()
    fixed_draw = _draw(default)
    assert np.array_equal(fixed_draw.masks, membership_masks(16, 3, 0.5, default.train.seed))
    fixed = RunStore(default.resolved_output_dir()).create(default, fixed_draw.data_info, fixed_draw.masks)
    design = inclusion_design(fixed)
    assert not design.qualifies and design.design == "fixed_fraction"
    assert "train.membership=independent" in design.reason


def test_inclusion_design_names_why_a_store_does_not_qualify():
    train = {"runs": 4, "member_fraction": 0.5, "membership": "independent"}
    assert inclusion_design({"origin": "finetune", "identity": {"train": train}}).qualifies
    quarter = inclusion_design({"origin": "finetune", "identity": {"train": train | {"member_fraction": 0.25}}})
    assert not quarter.qualifies and "probability 0.25" in quarter.reason
    imported = inclusion_design({"origin": "import", "identity": {"train": train}})
    assert not imported.qualifies and imported.design == "import" and "imported" in imported.reason
    legacy = inclusion_design({"identity": {"train": {"runs": 4, "member_fraction": 0.5}}})
    assert not legacy.qualifies and legacy.design == "fixed_fraction"


def test_an_unknown_design_is_refused_at_load_time():
    with pytest.raises(RecipeError, match="train.membership.*'fixed_fraction' or 'independent'"):
        load_recipe("demo-cpu", ["train.membership=poisson"])
