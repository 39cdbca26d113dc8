"""Validations where the truth is known: the indicator paper's synthetic protocol (r_Q vs the baseline
MIS) and memorization capacity on random tokens.
"""
