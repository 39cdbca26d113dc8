"""The attacks shipped with llmaudit, one module per family, each registering its specs
(`llmaudit.analyze.attacks.registry`). Import order is registration order, the default order of the attacks:
single-model text scores, the reference attack and its combinations, LiRA, EZ-MIA, WBC, the quantization-matched
reference, RMIA. What each computes (its definition is recorded with every result, `attack_definitions`):

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
                  model to the target (a monotone map of the paper's P / N); variants: catalog/ez_mia_attacks.py
- wbc             WBC (Chen 2026): mean over window sizes of the share of sliding windows in which the
                  base model's summed token loss exceeds the target's; variants: catalog/wbc_attacks.py
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

from llmaudit.analyze.attacks.catalog import (
    ez_mia_attacks,
    lira_attacks,
    matched_reference,
    reference_models,
    rmia_attacks,
    single_model,
    wbc_attacks,
)
from llmaudit.analyze.attacks.registry import register

SHIPPED = (single_model, reference_models, lira_attacks, ez_mia_attacks, wbc_attacks, matched_reference, rmia_attacks)
"""The families in the order their attacks are registered (the default order of results)."""

for _module in SHIPPED:
    for _spec in _module.SPECS:
        register(_spec)
