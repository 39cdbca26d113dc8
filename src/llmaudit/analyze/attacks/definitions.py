"""What each attack computes, recorded with every result (`attack_definitions`).

docs/science.md section 4. Every score is "HIGHER = more likely a member". Token losses are per-token
negative log-likelihoods l_t = -log p(x_t | x_<t) in nats; L(x) = mean_t l_t.

Conventions (recorded in `attack_definitions`, stored with every result so that scores computed under
different definitions are never compared silently):
- loss            -L(x)                                                  (Yeom 2018)
- min_k           mean of log p = -l_t over the ceil(k * T) tokens with the LOWEST probability (largest
                  l_t), at least 1 token; ceil is taken after rounding k * T to 9 decimals so that
                  0.2 * 15 = 3.0000000000000004 counts as 3                  (Shi 2024, k = 0.2)
- min_k_plus_plus per token (log p_t - mu_t) / sigma_t with mu_t, sigma_t the mean and std of log p over
                  the vocabulary UNDER the model's next-token distribution at position t (columns
                  token_vocab_mean / token_vocab_std); then the mean of the lowest ceil(k * T) of those.
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

DEFAULT_ATTACKS = TEXT_ATTACKS + ("lira_offline", "lira_online")

REF_MODELS = ("runs", "base", "both")


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
        "min_k": f"1:k={k:g},ceil(k*T)>=1,mean_logp_lowest",
        "min_k_plus_plus": f"1:k={k:g},ceil(k*T)>=1,(logp-mu_vocab)/sigma_vocab",
        "zlib": "1:-mean_nll/zlib_bytes",
        "ref": f"1:refs={ref_models},out-only,mean",
        "loss+zlib": "1:sum_zscore_per_target",
        "loss+ref": f"1:sum_zscore_per_target,refs={ref_models}",
        "loss+zlib+ref": f"1:sum_zscore_per_target,refs={ref_models}",
        "lira_offline": f"1:{lira},min_out=2",
        "lira_online": f"1:{lira},min_in=2,min_out=2",
        "calibration": f"1:per-sample-out-zscore,fpc={fpc_txt},student_t_below={t_cutoff:g}",
    }
