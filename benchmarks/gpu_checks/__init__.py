"""The checks of benchmarks/gpu_check.py (that script's docstring is the reference), one module per check:

    gpu_tests       a. `pytest -m gpu` (pytest_plugin: the outcome log it reads, loaded into that pytest)
    bench_scoring   b. benchmarks/bench_scoring.py at Qwen2.5's vocabulary and body
    quant_audit     c. the mini audit: real kernels vs the CPU reference
    ddp             d. a 2-process `accelerate launch` of `llmaudit finetune`
    train_score     e. bf16 LoRA training and scoring speed

and what they share: common (the result file, constants, the built-in tiny model), models (loading the real
model, the tiny LoRA, records, losses), install (the setup step: wheels from a folder) and runner (the parent:
the time budget, one process per check, the table)."""
