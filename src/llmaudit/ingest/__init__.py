"""`llmaudit import`: audit a fine-tune the user already trained (transformers.Trainer / TRL output directories).

checkpoints   the checkpoints of a training output directory (LoRA adapters or full models, safetensors only;
              the trainer's pickles are never opened), in trajectory order, and what its trainer recorded
build         `import_training`: the checks, the pool / validation / membership draw from the user's files,
              and the run store that references the checkpoints
"""
