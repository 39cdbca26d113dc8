from pathlib import Path

import pytest

from llmaudit.config import RECIPE_DIR, RecipeError, load_recipe, resolve_recipe_path

REPO_RECIPES = sorted(p for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
AUDIT_RECIPES = [p for p in REPO_RECIPES if p.stem != "synthetic-validation"]


def test_shipped_recipes_are_the_repo_recipes():
    assert sorted(p.name for p in RECIPE_DIR.glob("*.yaml")) == [p.name for p in REPO_RECIPES]


@pytest.mark.parametrize("path", AUDIT_RECIPES, ids=lambda p: p.stem)
def test_every_audit_recipe_validates(path):
    cfg = load_recipe(path)
    assert cfg.name == path.stem
    from llmaudit.quantize import get_quantizer

    for reference in ("fp32", "bf16"):  # `full` is named for the store's dtype once the store is known
        score = cfg.score.with_reference(reference)
        for q in score.quantizers:  # every name is registered, every option accepted
            get_quantizer(q, **score.quantizer_options.get(q, {}))


def test_the_full_placeholder_takes_the_store_dtypes_name_with_its_options():
    cfg = load_recipe(
        "demo-cpu", ["score.quantizers=[full,hqq-4,bf16]", "score.quantizer_options={full: {mode: fake}}"]
    )
    assert cfg.score.with_reference("fp32").quantizers == ["fp32", "hqq-4", "bf16"]
    assert cfg.score.with_reference("fp32").quantizer_options == {"fp32": {"mode": "fake"}}
    assert cfg.score.with_reference("bf16").quantizers == ["bf16", "hqq-4"]  # named twice: once
    from llmaudit.quantize import QuantizationError, get_quantizer

    with pytest.raises(QuantizationError, match="named for the dtype"):
        get_quantizer("full")


def test_paper_recipe_matches_the_published_setting():
    cfg = load_recipe("qwen2.5-0.5b-smolinstruct")
    assert cfg.model.name == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.lora.r == 64
    assert cfg.data.tasks == ["molecule_captioning", "molecule_generation"]
    assert cfg.data.source == "hub"
    assert round(cfg.data.pool_size * cfg.train.member_fraction) == 10_000
    assert (cfg.train.epochs, cfg.train.runs) == (10, 20)
    assert cfg.train.epochs * cfg.train.checkpoints_per_epoch == 20
    assert not cfg.model.trust_remote_code


def test_unknown_key_names_the_key():
    with pytest.raises(RecipeError, match=r"train\.epoch .*unknown key"):
        load_recipe("demo-cpu", ["train.epoch=3"])


def test_bad_value_names_key_value_and_allowed():
    with pytest.raises(RecipeError) as err:
        load_recipe("demo-cpu", ["data.source=huggingface"])
    msg = str(err.value)
    assert "data.source" in msg and "huggingface" in msg and "synthetic" in msg


def test_out_of_range_and_cross_field_checks():
    with pytest.raises(RecipeError, match="train.member_fraction"):
        load_recipe("demo-cpu", ["train.member_fraction=1.5"])
    with pytest.raises(RecipeError, match="data.path"):
        load_recipe("demo-cpu", ["data.source=local"])
    with pytest.raises(RecipeError, match="unknown task"):
        load_recipe("demo-cpu", ["data.tasks=[molecule_painting]"])


def test_overrides_are_typed_yaml():
    cfg = load_recipe("demo-cpu", ["train.epochs=3", "score.quantizers=[fp32,hqq-4]", "train.lr=1e-4"])
    assert cfg.train.epochs == 3 and cfg.score.quantizers == ["fp32", "hqq-4"] and cfg.train.lr == 1e-4
    with pytest.raises(RecipeError, match="key=value"):
        load_recipe("demo-cpu", ["train.epochs"])


def test_unknown_recipe_lists_the_shipped_ones():
    with pytest.raises(RecipeError, match="demo-cpu"):
        resolve_recipe_path("no-such-recipe")


def test_identity_ignores_scoring_settings():
    a = load_recipe("demo-cpu")
    b = load_recipe("demo-cpu", ["score.quantizers=[fp32]", "attack.n_boot=5", "train.device=cpu"])
    c = load_recipe("demo-cpu", ["train.epochs=2"])
    assert a.identity_hash() == b.identity_hash()
    assert a.identity_hash() != c.identity_hash()
