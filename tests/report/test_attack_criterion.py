"""The checklist's attack criterion over every attack that ran (the 2024-2026 attacks and their variants
included), and the report's strongest-attack-versus-LOSS line."""

from llmaudit.analyze.metrics import fpr_key
from llmaudit.report.cells import to_markdown
from llmaudit.report.grid import strongest_vs_loss
from llmaudit.report.models import AttackEntry, GridRow
from llmaudit.report.policy import FAIL, INCONCLUSIVE, NOT_MEASURED, PASS, release_checklist
from llmaudit.report.view_attacks import _skipped_bullets, _strongest_table

THRESHOLDS = {"max_tpr_at_1pct_fpr": 0.05, "min_r_q": 0.0, "max_utility_loss": 0.1, "min_runs": 5}


def _attack(tpr, ci, auroc, reliable=True):
    return AttackEntry.model_validate(
        {
            "auroc": auroc,
            "auroc_ci": [auroc - 0.02, auroc + 0.02],
            "n_models": 8,
            "not_measured": {},
            "low_fpr": {
                "pooled_calibrated": {
                    fpr_key(0.01): {"tpr": tpr, "ci": ci, "reliable": reliable, "min_negatives": 1000}
                }
            },
        }
    )


def _row(attacks):
    return GridRow.model_validate(
        {
            "quantizer": "hqq-4",
            "attacks": attacks,
            "skipped_attacks": {},
            "best_attack": None,
            "r_q": {"mean": None, "ci": None, "n_finite": 0, "n_undefined": 0},
            "utility": {"relative_change": 0.01, "relative_change_ci": [0.0, 0.02], "n_runs": 8},
        }
    )


def _attack_criterion(attacks):
    checklist = release_checklist([_row(attacks)], THRESHOLDS).per_quantizer["hqq-4"]
    return next(c for c in checklist.criteria if c.id == "attack_tpr"), checklist.overall


def test_one_new_attack_over_the_limit_fails_a_quantizer_that_loss_clears():
    safe = {"loss": _attack(0.01, [0.0, 0.03], 0.74), "wbc": _attack(0.02, [0.0, 0.04], 0.93)}
    crit, _ = _attack_criterion(safe)
    assert crit.status == PASS
    crit, overall = _attack_criterion(safe | {"ez_mia_bottom": _attack(0.20, [0.15, 0.25], 0.80)})
    assert crit.status == FAIL and overall == FAIL
    assert crit.reason.startswith("ez_mia_bottom:") and crit.per_attack["loss"].status == PASS


def test_the_worst_verdict_wins_over_every_attack():
    """FAIL > NOT MEASURED > INCONCLUSIVE > PASS, whichever attack carries it."""
    base = {"loss": _attack(0.01, [0.0, 0.03], 0.74)}
    crit, _ = _attack_criterion(base | {"rmia": _attack(0.03, [0.0, 0.08], 0.95)})
    assert crit.status == INCONCLUSIVE and crit.reason.startswith("rmia:")
    unreliable = _attack(0.01, [0.0, 0.02], 0.9, reliable=False)
    crit, _ = _attack_criterion(base | {"rmia": _attack(0.03, [0.0, 0.08], 0.95), "wbc_qbase": unreliable})
    assert crit.status == NOT_MEASURED and crit.reason.startswith("wbc_qbase:")


def test_strongest_attack_and_its_gain_over_loss():
    attacks = {
        "loss": _attack(0.067, None, 0.745),
        "rmia_online": _attack(0.196, None, 0.977),
        "ez_mia": _attack(0.223, None, 0.893),
        "wbc": _attack(0.117, None, 0.939),
    }
    vs = strongest_vs_loss(attacks)
    assert vs.tpr_at_1pct_calibrated.attack == "ez_mia"
    assert vs.tpr_at_1pct_calibrated.gain == 0.223 - 0.067 and vs.tpr_at_1pct_calibrated.reliable
    assert vs.auroc.model_dump(exclude_unset=True) == {
        "attack": "rmia_online",
        "value": 0.977,
        "loss": 0.745,
        "gain": 0.977 - 0.745,
    }
    assert strongest_vs_loss({"wbc": attacks["wbc"]}) is None  # no LOSS to compare with
    table = _strongest_table([GridRow.model_validate({"quantizer": "fp32", "strongest_vs_loss": vs})])
    assert [c.text for c in table.rows[0]] == [
        "fp32", "ez_mia", "0.223", "0.067", "+0.156", "rmia_online", "0.977", "0.745", "+0.232",
    ]  # fmt: skip


def test_skipped_attacks_are_listed_once_per_reason():
    why = "EZ-MIA not measurable: table predates top-1"
    grid = [
        {"quantizer": q, "skipped_attacks": {"ez_mia": why, "ez_mia_bottom": why} | extra}
        for q, extra in (("fp32", {"wbc_qbase": "no matched base"}), ("hqq-4", {}))
    ]
    bullets = [to_markdown(b) for b in _skipped_bullets([GridRow.model_validate(r) for r in grid])]
    assert len(bullets) == 2
    assert (
        "skipped `ez_mia`, `ez_mia_bottom` on `fp32`, `hqq-4`: EZ-MIA not measurable: table predates top-1" in bullets
    )
