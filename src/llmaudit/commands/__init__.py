"""The command line, one module per command: each holds its argument handling and what it prints, and calls the
library (`llmaudit.planning`, `llmaudit.jobs`, `llmaudit.report`, `llmaudit.validate`, ...) for the work. `app`
(commands/base.py) is the Typer application; importing this package registers every command on it, in the order
`llmaudit --help` lists them. `llmaudit.cli.main` runs it. A command module imports its work (torch, transformers,
the analysis, the report's models) inside the command's body, never at the top, and after its arguments are
checked (`llmaudit.planning.arguments`): `--help`, `--version` and an argument error answer without them
(tests/test_first_minutes.py checks that torch is not imported).
"""
# isort: skip_file

from llmaudit.commands.base import app
from llmaudit.commands import finetune, score, report, import_, audit, plan  # noqa: F401  (registration, in order)
from llmaudit.commands import indicator, attack, memorization, validate  # noqa: F401
from llmaudit.commands import quantizers, kld, status, submit  # noqa: F401

__all__ = ["app"]
