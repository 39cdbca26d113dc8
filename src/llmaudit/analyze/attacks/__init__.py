"""Membership inference attacks (docs/science.md section 4): the formulas (`text`, `lira`, `ez_mia`, `wbc`,
`rmia`), the registry of attacks (`registry`: one spec per attack), the attacks shipped with llmaudit
(`catalog`, registered when this package is imported), the settings of a run (`settings`) and the calibrated
evaluation of every attack on every quantizer (`evaluate`, in worker processes through `workers`).
"""

from llmaudit.analyze.attacks import catalog  # noqa: F401  (registers the shipped attacks)
