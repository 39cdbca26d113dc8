"""Base models and tokenizers (hub, local, built-in), the decoder/head split the engines use, and the
optimisation loop shared by the built-in model's pre-training and LoRA fine-tuning.
"""
