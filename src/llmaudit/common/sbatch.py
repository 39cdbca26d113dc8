"""What may reach a SLURM batch script: every `cluster.*` value and key checked against what its field may hold.

submitit writes each option as an `#SBATCH --key=value` line, quoting the value with shlex (which keeps
newlines) and the key not at all, so a newline in either would start a line of its own in the script: another
`#SBATCH` option, or a shell command the job runs. Each value is therefore checked against the form its option
takes (a partition name, a count, a memory size, an address), extra options against an allow list, and paths
refused with any control character. The cluster settings themselves come only from the recipe or the command
line of whoever submits, never from a run directory's manifest (`llmaudit.store.run_store.RunStore.config`).
"""

from __future__ import annotations

import re
from typing import Any

from llmaudit.common.errors import UserError

_NAME = r"[A-Za-z0-9_.+-]{1,128}"
_NAMES = rf"{_NAME}(,{_NAME}){{0,63}}"
_NODES = r"[A-Za-z0-9_.,\[\]-]{1,1024}"
_SIZE = r"[0-9]{1,9}[KMGT]?"
_INT = r"[0-9]{1,9}"

FIELD_FORMS: dict[str, tuple[str, str]] = {
    "partition": (_NAMES, "partition names of letters, digits and . _ + - (a comma-separated list for several)"),
    "account": (_NAME, "an account name of letters, digits and . _ + -"),
    "qos": (_NAME, "a QOS name of letters, digits and . _ + -"),
    "reservation": (_NAME, "a reservation name of letters, digits and . _ + -"),
    "wckey": (_NAME, "a wckey of letters, digits and . _ + -"),
    "clusters": (_NAMES, "cluster names of letters, digits and . _ + -, comma-separated"),
    "licenses": (r"[A-Za-z0-9_.:,@-]{1,256}", "licenses as name[:count], comma-separated"),
    "constraint": (r"[A-Za-z0-9_.,&|*:\[\]()-]{1,256}", "node features joined with & | , [ ] ( ) * :"),
    "gres": (r"[A-Za-z0-9_.:,-]{1,256}", "generic resources as name[:type]:count, comma-separated"),
    "exclude": (_NODES, "node names or ranges (node[01-04]), comma-separated"),
    "nodelist": (_NODES, "node names or ranges (node[01-04]), comma-separated"),
    "mail_type": (r"[A-Z0-9_,]{1,128}", "SLURM mail types in capitals (BEGIN, END, FAIL, ALL, ...), comma-separated"),
    "mail_user": (r"[A-Za-z0-9_.+-]{1,64}@[A-Za-z0-9.-]{1,190}", "one e-mail address"),
    "comment": (r"[A-Za-z0-9_.,:+-]{1,200}", "letters, digits and . _ , : + - (no spaces)"),
    "exclusive": (r"True|user|mcs", "true, user or mcs"),
    "hint": (r"[a-z_,]{1,64}", "SLURM hints (compute_bound, memory_bound, nomultithread, ...)"),
    "mem_per_cpu": (_SIZE, "a memory size: digits with an optional K, M, G or T"),
    "mem_per_gpu": (_SIZE, "a memory size: digits with an optional K, M, G or T"),
    "cpus_per_gpu": (_INT, "a whole number"),
    "gpus_per_task": (_INT, "a whole number"),
    "gpus": (r"([a-z0-9_.-]{1,64}:)?[0-9]{1,4}", "[type:]count"),
    "signal": (r"(B:)?[A-Z0-9]{1,16}(@[0-9]{1,6})?", "[B:]SIGNAL[@seconds]"),
    "requeue": (r"True", "true"),
    "hold": (r"True", "true"),
    "time_min": (_INT, "minutes as a whole number"),
}
"""The options `cluster.slurm_additional_parameters` may set (keys as submitit writes them, with _), each with the
form its value must have and that form in words. Options that change where files go or what runs (chdir, output,
error, wrap, dependency, export, ...) are not among them."""

_DEPENDENCY = re.compile(r"afterok:[0-9]{1,20}")
"""The one option llmaudit sets itself (a stage waits for the previous stage's array job)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def option_problem(key: Any, value: Any) -> str | None:
    """Why extra sbatch option `key` = `value` may not reach a batch script (None when it may)."""
    if not isinstance(key, str) or key.replace("-", "_") not in FIELD_FORMS:
        return f"option {_shown(key)} is not allowed in a batch script; allowed: {', '.join(sorted(FIELD_FORMS))}"
    return value_problem(key.replace("-", "_"), value)


def value_problem(field: str, value: Any) -> str | None:
    """Why `value` may not be sbatch option `field` (None when it has the option's form)."""
    pattern, words = FIELD_FORMS[field]
    text = str(value) if isinstance(value, (str, int)) else None  # booleans and whole numbers as written
    if text is None or re.fullmatch(pattern, text) is None:
        return f"{_shown(value)} is not allowed in a batch script: use {words}"
    return None


def path_problem(value: Any) -> str | None:
    """Why a path may not be written into a batch script (submitit's log folder): a control character."""
    text = str(value)
    if _CONTROL.search(text) or len(text) > 4096:
        return (
            "holds a line break or control character (or is over 4,096 characters): it would end a line of the "
            "batch script; use a plain path"
        )
    return None


def check_script_parameters(params: dict[str, Any], folder: Any) -> None:
    """The last gate before submitit writes the script: every parameter and the log folder, UserError naming the
    first that may not reach it. `params` are submitit AutoExecutor parameters (`llmaudit.jobs.submit`)."""
    problems = [f"log folder {_shown(str(folder))}: {path_problem(folder)}"] if path_problem(folder) else []
    for key, value in params.items():
        if key == "slurm_additional_parameters":
            extra = {k: v for k, v in value.items() if not (k == "dependency" and _DEPENDENCY.fullmatch(str(v)))}
            problems += [f"{k}: {option_problem(k, v)}" for k, v in extra.items() if option_problem(k, v)]
        elif key == "slurm_partition" and value_problem("partition", value):
            problems.append(f"partition: {value_problem('partition', value)}")
        elif key == "name" and path_problem(value):
            problems.append(f"job name {_shown(value)}: {path_problem(value)}")
        elif key not in ("name", "slurm_partition") and not (isinstance(value, int) and not isinstance(value, bool)):
            problems.append(f"{key} = {_shown(value)} is not a whole number")
    if problems:
        raise UserError(f"batch script refused: {'; '.join(problems)}; fix the cluster.* setting it names.")
