"""From loss tables to numbers: the indicator r_Q, the attacks and their evaluation, memorization,
utility. Formulas are pure functions; `store_analysis.analyze` is the one orchestrator.
"""
