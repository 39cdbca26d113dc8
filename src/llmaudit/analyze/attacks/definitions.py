"""What each attack computes, recorded with every result (`attack_definitions`).

docs/science.md section 4. Every score is "HIGHER = more likely a member". Token losses are per-token
negative log-likelihoods l_t = -log p(x_t | x_<t) in nats; L(x) = mean_t l_t.

Conventions (recorded in `attack_definitions`, stored with every result so that scores computed under
different definitions are never compared silently):
- loss            -L(x)                                                  (Yeom 2018)
- min_k           mean of log p = -l_t over the floor(k * T) tokens with the LOWEST probability (largest
                  l_t), at least 1 token (a text with k * T < 1 is scored on its least likely token);
                  floor is taken after rounding k * T to 9 decimals so that 0.29 * 100 =
                  28.999999999999996 counts as 29. mimir and the Min-K%++ authors' code take
                  int(k * T), which is floor (and leaves k * T < 1 undefined)   (Shi 2024, k = 0.2)
- min_k_plus_plus per token (log p_t - mu_t) / sigma_t with mu_t, sigma_t the mean and std of log p over
                  the vocabulary UNDER the model's next-token distribution at position t (columns
                  token_vocab_mean / token_vocab_std); then the mean of the lowest floor(k * T) of those
                  (at least 1), as min_k counts them.
                  A position with sigma_t = 0 (a one-token distribution) contributes 0  (Zhang 2024)
- zlib            -L(x) / zlib_bytes(x): mean NLL in nats per token over the zlib-compressed length of
                  the text in bytes (the "-L / zlib length" normalisation of docs/science.md; the
                  "log-perplexity over zlib entropy" variant differs by a constant factor)  (Carlini 2021)
- ref             -(L_target(x) - mean_i L_ref_i(x)), references: "runs" = the OTHER runs' models that
                  did NOT train on x (an attacker who trains references knows their training sets),
                  "base" = the base model before fine-tuning (rows with run == -1), "both" = the mean over
                  the union of those models (the base counts as one more reference)
- loss+zlib, loss+ref, loss+zlib+ref
                  each component is z-scored over the pool samples of the target model (mean 0, sd 1
                  across samples, per target) and the z-scores are summed with equal weights
- ez_mia          EZ-MIA (Ilic 2026): over the positions where the target's top-1 prediction is wrong,
                  P / (P + N), P and N the summed positive and negative shifts of log p from the base
                  model to the target (a monotone map of the paper's P / N); variants: EZ_MIA_VARIANTS
- wbc             WBC (Chen 2026): mean over window sizes of the share of sliding windows in which the
                  base model's summed token loss exceeds the target's; variants: WBC_VARIANTS
- ref_qbase       -(L_target(x) - L_qbase(x)), the base model quantized with the target's quantizer
- rmia            RMIA (Zarifzadeh 2024), offline: share of population texts z with
                  [p(x|theta) / p(x)] / [p(z|theta) / p(z)] > 1, p = exp(-L), p(x) from the other runs
                  where x was OUT, scaled by the coefficient a tuned on a paired reference run
- rmia_online     the same with p(x) the mean of the IN and the OUT references' means
"base" is always the reference unit: the base model's own loss table (rows with run == -1) under the
reference quantizer; "qbase" the base model's rows under the target's own quantizer (score.matched_base).
- lira_offline    per-sample standardization (t - mu_out) / sigma_out of the LiRA statistic, mu and sigma
                  from the OTHER models where the sample was out (Carlini 2022, offline)
- lira_online     log N(t; mu_in, sd_in) - log N(t; mu_out, sd_out) (Carlini 2022, online)

LiRA statistic: phi(x) = logit(p) with p = exp(-L(x)), the geometric-mean token probability, i.e.
phi = -L - log(1 - exp(-L)). For L >> 1 (typical of non-members) phi ~ -L, a mean of T token losses and
so close to Gaussian across models by the central limit theorem; for L -> 0 (memorised members) phi ~
-log L, which turns the multiplicative, floor-bounded spread of small losses into a symmetric one. This
is Carlini et al.'s argument for logit-scaled confidences; `neg_loss` (-L) is available as an option.
"""

from __future__ import annotations

from llmaudit.analyze.attacks.text import TEXT_ATTACKS
from llmaudit.analyze.metrics import T_CUTOFF

EZ_MIA_DEFAULT = {"edge": "top", "skip_first": False}
"""EZ-MIA's conventions (docs/science.md section 4: which one, and the evidence that chose it)."""

EZ_MIA_VARIANTS: dict[str, dict] = {
    "ez_mia": dict(EZ_MIA_DEFAULT, reference="base"),
    "ez_mia_bottom": dict(EZ_MIA_DEFAULT, edge="bottom", reference="base"),
    "ez_mia_skip_first": dict(EZ_MIA_DEFAULT, skip_first=True, reference="base"),
    "ez_mia_qbase": dict(EZ_MIA_DEFAULT, reference="matched"),
}
"""EZ-MIA and its labelled variants: the other edge convention (the authors' code), the first scored
position left out, and the quantization-matched reference."""

WBC_DEFAULT = {"grid": "config", "long": "clamp"}
"""WBC's conventions (docs/science.md section 4)."""

WBC_VARIANTS: dict[str, dict] = {
    "wbc": dict(WBC_DEFAULT, reference="base"),
    "wbc_paper_grid": dict(WBC_DEFAULT, grid="paper", reference="base"),
    "wbc_skip_long": dict(WBC_DEFAULT, long="skip", reference="base"),
    "wbc_qbase": dict(WBC_DEFAULT, reference="matched"),
}
"""WBC and its labelled variants: the paper's geometric grid, windows longer than the text skipped
(LeakPro), and the quantization-matched reference."""

RMIA_ATTACKS = ("rmia", "rmia_online")

REFERENCE_ATTACKS = tuple(EZ_MIA_VARIANTS) + tuple(WBC_VARIANTS) + ("ref_qbase",) + RMIA_ATTACKS
"""The attacks of 2024-2026 and the quantization-matched variants (analyze/attacks/matrices.py)."""

DEFAULT_ATTACKS = TEXT_ATTACKS + ("lira_offline", "lira_online") + REFERENCE_ATTACKS

LEGACY_DEFAULT_ATTACKS = TEXT_ATTACKS + ("lira_offline", "lira_online")
"""The full attack list before the attacks of 2024-2026: a recorded config holding exactly this list asked
for "every attack" (run stores write their resolved config), and is read as DEFAULT_ATTACKS."""

REF_MODELS = ("runs", "base", "both")


def _variant_text(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


def attack_definitions(
    *,
    k: float = 0.2,
    ref_models: str = "runs",
    statistic: str = "logit",
    lira_variance: str = "per_sample",
    fpc_value: float | None = None,
    t_cutoff: float = T_CUTOFF,
) -> dict[str, str]:
    """Versioned definition string of every attack; stored in each result."""
    fpc_txt = "none" if fpc_value is None else f"{fpc_value:.6g}"
    lira = f"stat={statistic},var={lira_variance},fpc={fpc_txt}"
    return {
        "loss": "1:-mean_nll",
        "min_k": f"2:k={k:g},floor(k*T)>=1,mean_logp_lowest",
        "min_k_plus_plus": f"2:k={k:g},floor(k*T)>=1,(logp-mu_vocab)/sigma_vocab",
        "zlib": "1:-mean_nll/zlib_bytes",
        "ref": f"2:refs={ref_models},out-only,balanced,mean,rounding_ties=0",
        "loss+zlib": "2:sum_zscore_per_target,rounding_constant=0",
        "loss+ref": f"2:sum_zscore_per_target,rounding_constant=0,refs={ref_models}",
        "loss+zlib+ref": f"2:sum_zscore_per_target,rounding_constant=0,refs={ref_models}",
        "lira_offline": f"2:{lira},balanced_refs,min_out=2",
        "lira_online": f"2:{lira},balanced_refs,min_in=2,min_out=2",
        **{name: f"1:error-zone,P/(P+N),{_variant_text(v)}" for name, v in EZ_MIA_VARIANTS.items()},
        **{name: f"1:window-sign-vote,{_variant_text(v)}" for name, v in WBC_VARIANTS.items()},
        "ref_qbase": "1:-(L_target-L_base),base=same-quantizer",
        "rmia": "2:offline,p=exp(-L),refs=other-runs-out,balanced,a=tuned-on-paired-run,gamma=1,z=val",
        "rmia_online": "2:online,p=exp(-L),refs=other-runs-in+out,balanced,gamma=1,z=val",
        "calibration": f"3:per-sample-out-zscore,balanced_refs,zero_spread=pooled_sd,rounding_ties,fpc={fpc_txt},student_t_below={t_cutoff:g}",
    }
