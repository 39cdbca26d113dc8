"""Tests of the synthetic validation (llmaudit.synthetic): trainer, data, r_Q batch, MIS, config."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import rankdata

from llmaudit.analyze.rq import r_q
from llmaudit.common.stats import spearman_rho as spearman
from llmaudit.validate.synthetic.classifier import (
    init_linear,
    per_sample_losses,
    quantize_batched,
    train_batched,
)
from llmaudit.validate.synthetic.config import QUANTIZER_NAMES, VARIANT_NAMES, SyntheticConfigError, load_config
from llmaudit.validate.synthetic.data import derive_seed, make_dataset, make_mixture, sample_mixture
from llmaudit.validate.synthetic.estimators import (
    VariantInputs,
    r_q_all_variants,
    r_q_batched,
    r_q_batched_details,
    r_q_from_points,
)
from llmaudit.validate.synthetic.mis import (
    DiscriminatorSettings,
    _train_discriminators_autograd,
    split_runs,
    train_discriminators,
)
from llmaudit.validate.synthetic.outputs import validate_synthetic_command
from llmaudit.validate.synthetic.protocol import spearman_rows

from .reference_impls import train_discriminator_reference, train_per_run

REPO = Path(__file__).resolve().parents[2]


def _tiny_runs(R=3, n=16, d=8, epochs=3, seed=0):
    cfg = load_config(
        None,
        [
            f"n_runs={max(R, 5)}",
            f"n_train={n}",
            f"dim={d}",
            f"epochs={epochs}",
            "n_val=20",
            "converged_from_epoch=1",
            "batch_size=1",
        ],
    )
    data = make_dataset(cfg, 0, 4, 1.0, n_runs=R)
    w0, b0 = init_linear([derive_seed(seed, r) for r in range(R)], d)
    return data, w0, b0


@pytest.mark.parametrize("batch_size", [1, 4, 16])
def test_batched_trainer_matches_per_run_loop(batch_size):
    data, w0, b0 = _tiny_runs()
    args = (data["x_train"], data["y_train"], w0, b0, data["order"])
    wb, bb = train_batched(*args, lr=1e-2, batch_size=batch_size)
    wr, br = train_per_run(*args, lr=1e-2, batch_size=batch_size)
    assert wb.shape == wr.shape == (4, 3, 2, 8) and bb.shape == br.shape == (4, 3, 2)
    assert (wb[-1] - wb[0]).abs().max() > 1e-3  # it actually trained
    torch.testing.assert_close(wb, wr, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bb, br, rtol=1e-5, atol=1e-6)


def test_init_is_pytorch_default_linear_init():
    w, b = init_linear([7, 8], 16)
    torch.manual_seed(7)
    lin = torch.nn.Linear(16, 2)
    torch.testing.assert_close(w[0], lin.weight.detach())
    torch.testing.assert_close(b[0], lin.bias.detach())
    assert not torch.equal(w[0], w[1])


def test_data_generator_is_deterministic():
    cfg = load_config(None, ["n_runs=5", "n_val=30", "dim=16", "n_train=8"])
    a = make_dataset(cfg, 2, 6, 1.5)
    b = make_dataset(cfg, 2, 6, 1.5)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    c = make_dataset(load_config(None, ["n_runs=5", "n_val=30", "dim=16", "n_train=8", "seed=1"]), 2, 6, 1.5)
    assert not torch.equal(a["x_train"], c["x_train"])
    # labels alternate over clusters and both classes occur; members and non-members are different draws
    centres, labels = make_mixture(6, 16, torch.Generator().manual_seed(0))
    assert labels.tolist() == [0, 1, 0, 1, 0, 1]
    assert not torch.equal(a["x_train"], a["x_out"])
    assert set(a["y_train"].unique().tolist()) == {0, 1}


def test_r_q_batched_equals_indicator_r_q():
    rng = np.random.default_rng(0)
    L = rng.gamma(2.0, 1.0, size=(40, 9, 25))
    L[:, 4] = L[:, 1]  # identical quantized points are merged
    L[:5, 7] = L[:5, 0]
    L[5] = L[5, 0]  # one distinct point only: undefined (nan)
    L[6] = rng.integers(0, 5, size=(9, 25))  # integers: the means below are exactly equal
    L[6, 2] = rng.integers(0, 2, size=25)
    L[6, 3] = L[6, 2][::-1]  # two distinct lowest points with the same mean: r_Q = 0
    L[7] = rng.integers(0, 5, size=25) + np.arange(9)[:, None]  # exact constant shifts only: r_Q = inf
    got = r_q_batched(L)
    want = np.array([r_q(L[i]) for i in range(len(L))])
    assert math.isnan(got[5]) and math.isnan(want[5])
    assert got[6] == want[6] == 0.0 and got[7] == want[7] == math.inf
    np.testing.assert_allclose(got, want, rtol=1e-10, equal_nan=True)
    _, points = r_q_batched_details(L)
    assert points[0] == 7 and points[8] == 8 and points[5] == 1


def test_quantize_batched_is_per_tensor():
    from llmaudit.quantize import simple

    w = torch.randn(4, 2, 16)
    for name in QUANTIZER_NAMES:
        got = quantize_batched(name, w)
        for r in range(4):
            kind, _, arg = name.partition("-")
            ref = (
                simple.sign_quantize(w[r])
                if kind == "sign"
                else simple.ternary_quantize(w[r], int(arg) / 100)
                if kind == "ternary"
                else simple.uniform_quantize(w[r], int(arg))
            )
            torch.testing.assert_close(got[r], ref)


def _mis_of(loss_fn, R=40, n=64, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres, labels = make_mixture(4, d, g)
    x_in, y_in = sample_mixture(centres, labels, 1.0, (R, n), g)
    x_out, y_out = sample_mixture(centres, labels, 1.0, (R, n), g)
    x = torch.cat([x_in, x_out], 1)
    feats = [
        {
            "x": x,
            "y": torch.cat([y_in, y_out], 1).float(),
            "theta": torch.zeros(R, 6),
            "loss": loss_fn(x, x_in),
            "member": torch.cat([torch.ones(R, n), torch.zeros(R, n)], 1),
        }
    ]
    tr, te = split_runs(R, 0.8, torch.Generator().manual_seed(1))
    settings = DiscriminatorSettings(hidden=32, epochs=5, lr=3e-3, batch_size=128, dtype="float32", seed=0)
    out = train_discriminators(feats, tr, te, settings)
    return float(2 - 2 * out["correct"].mean())


def test_mis_of_memorizing_1nn_is_near_zero():
    # a 1-NN lookup: its loss is the distance to the nearest stored training point (0 on members)
    mis = _mis_of(lambda x, x_in: torch.cdist(x, x_in).min(-1).values)
    assert mis < 0.1


def test_mis_of_constant_model_is_near_one():
    mis = _mis_of(lambda x, x_in: torch.full(x.shape[:2], math.log(2.0)))
    assert mis > 0.85


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(SyntheticConfigError, match="n_rnus"):
        load_config(None, ["n_rnus=3"])
    with pytest.raises(SyntheticConfigError, match=r"quantizers.*int-8.*allowed.*uniform-5"):
        load_config(None, ["quantizers=[sign, int-8]"])
    with pytest.raises(SyntheticConfigError, match="rq_loss_split.*'test'"):
        load_config(None, ["rq_loss_split=test"])
    with pytest.raises(SyntheticConfigError, match="batch_size=5 must divide n_train=128"):
        load_config(None, ["batch_size=5"])
    cfg = load_config(None, ["lr=1e-3", "sigmas=[2]", "quantize_bias=false"])
    assert cfg.lr == 1e-3 and cfg.sigmas == [2.0] and cfg.quantize_bias is False


def test_shipped_recipe_is_valid_and_is_the_default():
    cfg = load_config(REPO / "recipes" / "synthetic-validation.yaml")
    assert cfg == load_config(None)
    assert cfg.n_runs == 300 and cfg.k_modes == [6, 8, 16] and cfg.sigmas == [1.5, 2.0, 3.0]
    assert cfg.lr == 1e-4 and cfg.epochs == 30 and cfg.dim == 128 and cfg.n_train == 128


def test_end_to_end_tiny(tmp_path):
    over = [
        "n_runs=8",
        "k_modes=[4]",
        "sigmas=[1.0, 2.0]",
        "dim=8",
        "n_train=16",
        "n_val=40",
        "epochs=4",
        "batch_size=4",
        "lr=1e-2",
        "disc_hidden=16",
        "disc_epochs=2",
        "n_boot=20",
        "stability_resamples=2",
        "stability_k_runs=[4, 8]",
        "stability_mis_resamples=1",
        "converged_from_epoch=2",
        "perturb_points=4",
        "rq_first_epoch=1",
    ]
    res = validate_synthetic_command(None, over, tmp_path / "out")
    out = tmp_path / "out"
    for name in ("results.json", "results.md", "config.yaml", "rq_vs_mis.png", "stability.png"):
        assert (out / name).is_file(), name
    assert len(res["datasets"]) == 2
    assert set(res["summary"]) == {"published", *VARIANT_NAMES}
    ds = res["datasets"][0]
    assert set(ds["table"]) == set(QUANTIZER_NAMES)
    mis = [t["mis"] for t in ds["table"].values()]
    assert [t["rank_mis"] for t in ds["table"].values()] == pytest.approx(list(rankdata([-m for m in mis])))
    # reciprocal per run is exactly 1 / (2 r_Q)
    pub = np.array(ds["r_q_per_run"]["published"]["sign"])
    rec = np.array(ds["r_q_per_run"]["reciprocal"]["sign"])
    ok = np.isfinite(pub) & (pub > 0)
    np.testing.assert_allclose(rec[ok], 0.5 / pub[ok])
    assert "protocol" in res and "quantization" in res["protocol"]
    assert "| sign |" in (out / "results.md").read_text()


def _disc_feats(Q=3, R=20, m=16, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, m, d, generator=g)
    y = (torch.rand(R, m, generator=g) > 0.5).float()
    member = torch.cat([torch.ones(R, m // 2), torch.zeros(R, m // 2)], 1)
    return [
        {
            "x": x,
            "y": y,
            "theta": torch.randn(R, 2 * d + 2, generator=g).sign() * (q + 1),
            "loss": torch.rand(R, m, generator=g) * (1 + member * q),
            "member": member,
        }
        for q in range(Q)
    ]


def test_batched_discriminators_match_one_at_a_time_reference():
    """The batched trainer (all quantizers' discriminators as stacked tensors, written-out backward,
    one Adam over one flat buffer) equals training each discriminator alone (nn.Linear + ReLU +
    nn.Linear on the full rows, autograd, torch.optim.Adam) from the same init and row order."""
    Q, hidden = 3, 16
    feats = _disc_feats(Q)
    tr, te = split_runs(20, 0.8, torch.Generator().manual_seed(1))
    settings = DiscriminatorSettings(hidden=hidden, epochs=3, lr=3e-3, batch_size=32, dtype="float32", seed=0)
    out = train_discriminators(feats, tr, te, settings, return_state=True)
    assert (out["params"]["w_th"] - out["init"]["w_th"]).abs().max() > 1e-3  # it actually trained
    for q in range(Q):
        ref = train_discriminator_reference(out["prepared"], q, out["init"], out["perms"], tr, te, settings)
        for k, want in ref["params"].items():
            got = out["params"][k][:, q * hidden : (q + 1) * hidden] if k == "w_xy" else out["params"][k][q]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=f"quantizer {q} parameter {k}")
        np.testing.assert_allclose(out["correct"][q], ref["correct"])
        assert out["train_acc"][q] == pytest.approx(ref["train_acc"])
    # the previous autograd implementation (stacked parameters, torch.optim.Adam) gives the same result
    old = _train_discriminators_autograd(feats, tr, te, settings)
    np.testing.assert_allclose(out["correct"], old["correct"])
    np.testing.assert_allclose(out["train_acc"], old["train_acc"])


def test_r_q_all_variants_equals_separate_estimates():
    """One quantization and loss pass per quantizer gives the same r_Q as separate r_q_from_points
    calls per estimator, and r_q_from_points equals llmaudit.indicator.r_q per run."""
    cfg = load_config(
        None,
        [
            "n_runs=6",
            "n_train=16",
            "dim=8",
            "epochs=6",
            "n_val=30",
            "batch_size=4",
            "lr=1e-2",
            "converged_from_epoch=3",
        ],
    )
    data = make_dataset(cfg, 0, 4, 1.0)
    w0, b0 = init_linear([derive_seed(0, r) for r in range(6)], 8)
    tw, tb = train_batched(data["x_train"], data["y_train"], w0, b0, data["order"], lr=cfg.lr, batch_size=4)
    g = torch.Generator().manual_seed(0)
    pert = (
        tw[-1] + 0.1 * torch.randn(5, *tw.shape[1:], generator=g),
        tb[-1] + 0.1 * torch.randn(5, *tb.shape[1:], generator=g),
    )
    ep, cs = slice(1, None), slice(3, None)
    for q in ("sign", "ternary-50", "uniform-3"):
        inputs = VariantInputs(data["x_val"], data["y_val"], data["x_train"], data["y_train"], pert)
        est, pts = r_q_all_variants(q, tw, tb, inputs, cfg, list(VARIANT_NAMES))
        args = dict(quantize_bias=True, ddof=1)
        want = {
            "published": r_q_from_points(q, tw[ep], tb[ep], data["x_val"], data["y_val"], **args),
            "converged": r_q_from_points(q, tw[cs], tb[cs], data["x_val"], data["y_val"], **args),
            "train-loss": r_q_from_points(q, tw[ep], tb[ep], data["x_train"], data["y_train"], **args),
            "perturbed": r_q_from_points(q, *pert, data["x_val"], data["y_val"], **args),
            "unquantized-bias": r_q_from_points(
                q, tw[ep], tb[ep], data["x_val"], data["y_val"], quantize_bias=False, ddof=1
            ),
        }
        assert set(est) == set(want)
        for v in want:
            np.testing.assert_allclose(est[v], want[v], rtol=1e-4, equal_nan=True, err_msg=f"{q} {v}")
        # and the per-run reference: llmaudit.indicator.r_q on the flattened per_sample_losses
        K = tw[ep].shape[0]
        wq = quantize_batched(q, tw[ep].reshape(-1, 2, 8))
        bq = quantize_batched(q, tb[ep].reshape(-1, 2))
        L = per_sample_losses(wq, bq, data["x_val"], data["y_val"]).reshape(K, 6, -1).double().numpy()
        ref = np.array([r_q(L[:, r]) for r in range(6)])
        np.testing.assert_allclose(est["published"], ref, rtol=1e-4, equal_nan=True)


def test_spearman_rows_equals_spearman():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 8)), rng.normal(size=(300, 8))
    a[:50] = np.round(a[:50])  # ties
    b[50:80] = np.round(b[50:80] * 0.3)
    a[80, 2] = np.nan  # non-finite entries and constant rows: the scalar path
    b[81] = 1.0
    a[82] = np.inf
    want = np.array([spearman(x, y) for x, y in zip(a, b)])
    np.testing.assert_allclose(spearman_rows(a, b), want, rtol=0, atol=1e-12, equal_nan=True)
