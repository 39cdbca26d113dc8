"""`llmaudit import`: audit a fine-tune the user already trained (transformers.Trainer / TRL output directories).

checkpoints   the checkpoints of a training output directory (LoRA adapters or full models, safetensors only;
              the trainer's pickles are never opened), in trajectory order, and what its trainer recorded
draw          the user's training and held-out files read, checked for overlap, and drawn into the pool
              (membership) and the validation records
build         `import_training` (an `ImportRequest`): the checks, the config, and the run store that references
              the checkpoints
"""
