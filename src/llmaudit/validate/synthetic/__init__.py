"""Synthetic validation of the indicator r_Q against the baseline MIS (docs/science.md section 5).

`llmaudit validate synthetic [RECIPE] [key=value ...] --out DIR` runs `validate_synthetic_command`.

Pipeline per data set (k_modes x sigma):
1. `make_mixture` / `sample_mixture`: Gaussian mixture in R^dim, labels alternating over clusters.
2. `train_batched`: all R runs of single-layer (linear dim -> 2) classifiers trained at once as
   batched tensors with Adam; one checkpoint per epoch. The tests compare it with the straightforward
   loop (nn.Linear + torch.optim.Adam per run, tests/validate/reference_impls.py).
3. r_Q per run and quantizer: quantize every checkpoint, per-sample losses on the validation set,
   `r_q_batched` (Algorithm 2, equal to `llmaudit.indicator.r_q` row by row), mean over runs.
   `r_q_all_variants` computes the published estimator and the variants of one quantizer from one
   quantization of the trajectory and one loss pass per input set (`r_q_from_points` per estimator
   is the reference).
4. Baseline MIS: `train_discriminators` fits one 388 -> 256 -> 1 feed-forward discriminator per
   quantizer on [x, y, flattened quantized parameters, loss] rows of 80% of the runs; MIS = 2 - 2 acc
   on the rows of the remaining runs. All quantizers' discriminators train at once as stacked
   tensors (written-out forward/backward, one Adam over one flat parameter buffer); the tests compare them
   with one network trained alone (nn.Linear + autograd + torch.optim.Adam, tests/validate/reference_impls.py).
5. Spearman rho between the two rankings, the stability study, and clearly labelled r_Q VARIANTS
   (never replacing the published estimator) that probe the sign of that correlation.
"""
