"""`llmaudit report`: the quantizer grid, privacy and utility side by side, rendered as report.json,
report.md and report.html from one report object; the release checklist; figures.
"""
