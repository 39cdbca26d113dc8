"""Membership inference attacks (docs/science.md section 4): per-sample scores from token losses
(`text`), LiRA (`lira`), their versioned definitions (`definitions`) and the calibrated evaluation of
every attack on every quantizer (`evaluate`).
"""
