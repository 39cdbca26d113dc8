"""`llmaudit finetune`: LoRA runs on random subsets of a pool, with checkpoints along each trajectory."""
