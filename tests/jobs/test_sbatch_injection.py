"""Nothing reaches the batch script `llmaudit submit` writes from data: a hostile `cluster.*` value or key (a
newline with an `#SBATCH` line, `$(...)`, backticks, `;`) is refused in one line with exit 2 when it comes from
the command line, and ignored when it comes from a received store's manifest (the cluster settings are the
submitter's); the script submitit would write holds none of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmaudit.common.errors import UserError
from llmaudit.common.sbatch import check_script_parameters
from llmaudit.config import ClusterConfig, load_recipe
from llmaudit.finetune.experiment import prepare_experiment
from llmaudit.jobs.submit import slurm_parameters, submit
from llmaudit.planning.targets import config_from_run_dir
from llmaudit.store.run_store import RunStore
from tests.conftest import TINY_OVERRIDES, run_cli

PLANTED = ("#SBATCH --chdir=/", "$(touch /tmp/pwned)", "`id`", "; rm -rf ~", "--error=/etc")
HOSTILE_VALUES = [
    "gpu\n#SBATCH --chdir=/",
    "gpu$(touch /tmp/pwned)",
    "gpu`id`",
    "gpu; rm -rf ~",
    "gpu\r\n#SBATCH --chdir=/",
]
HOSTILE_KEYS = ["x\n#SBATCH --chdir=/", "chdir", "error", "wrap", "a; rm -rf ~", "$(touch /tmp/pwned)", "`id`"]
HOSTILE_OVERRIDES = (
    [f"cluster.partition={json.dumps(v)}" for v in HOSTILE_VALUES]
    + [f"cluster.slurm_additional_parameters={json.dumps({'account': v})}" for v in HOSTILE_VALUES]
    + [f"cluster.slurm_additional_parameters={json.dumps({k: 'x'})}" for k in HOSTILE_KEYS]
    + ['cluster.slurm_additional_parameters={"error": "/etc/x"}', 'cluster.log_dir="/tmp/x\\n#SBATCH --chdir=/"']
)


class ScriptRecorder:
    """A submitit AutoExecutor for SLURM whose `map_array` writes down the batch script instead of calling sbatch."""

    scripts: list[str] = []

    def __init__(self, folder: str, cluster: str) -> None:
        import submitit

        self.executor = submitit.AutoExecutor(folder=folder, cluster=cluster)

    def update_parameters(self, **params) -> None:
        self.executor.update_parameters(**params)

    def map_array(self, fn, *args):
        inner = self.executor._executor
        ScriptRecorder.scripts.append(inner._make_submission_file_text("python -m submitit.core._submit", "uid"))
        return [type("Job", (), {"job_id": f"4242_{i}"})() for i in range(len(args[0]))]


@pytest.mark.parametrize("override", HOSTILE_OVERRIDES)
def test_hostile_cluster_settings_on_the_command_line_are_refused_in_one_line(override, tmp_path):
    code, out, err = run_cli(["submit", "all", "demo-cpu", "cluster.cluster=slurm", override, "--out", tmp_path / "r"])
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "cluster." in err and "batch script" in err
    assert not (tmp_path / "r").exists()


def test_a_received_manifests_cluster_section_never_reaches_the_script(tmp_path, monkeypatch):
    import submitit.slurm.slurm

    monkeypatch.setattr(submitit.slurm.slurm.SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # no srun here
    root = tmp_path / "received"
    cfg = load_recipe("demo-cpu", [*TINY_OVERRIDES, f"output_dir={root}"])
    prepare_experiment(cfg, RunStore(root), echo=lambda *a: None)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["config"]["cluster"] = {
        "cluster": "slurm",
        "partition": HOSTILE_VALUES[0],
        "log_dir": "/etc/llmaudit",
        "slurm_additional_parameters": {"chdir": "/", "error": "/etc/x", HOSTILE_KEYS[0]: HOSTILE_VALUES[1]},
    }
    RunStore(root).write_manifest(manifest)  # a sender can give it a valid digest: the cluster section is not in it
    received = config_from_run_dir(root, ["cluster.cluster=slurm", "cluster.slurm_additional_parameters={qos: high}"])
    assert received.cluster.model_dump() == {
        **ClusterConfig().model_dump(),
        "cluster": "slurm",
        "slurm_additional_parameters": {"qos": "high"},
    }
    ScriptRecorder.scripts = []
    submit(received, "report", executor_factory=ScriptRecorder, echo=lambda *a: None)
    (script,) = ScriptRecorder.scripts
    assert "#SBATCH --qos=high" in script
    for planted in (*PLANTED, "/etc/llmaudit", "--chdir"):
        assert planted not in script
    sbatch_lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert all(str(root.resolve() / "jobs") in line for line in sbatch_lines if "--output" in line or "--error" in line)


def test_the_last_gate_refuses_what_bypassed_the_recipe(tmp_path):
    """A config built without validation (model_construct) still cannot put a line into the script."""
    cfg = load_recipe("demo-cpu", [])
    bad = cfg.cluster.model_construct(
        **{**cfg.cluster.model_dump(), "partition": HOSTILE_VALUES[0], "slurm_additional_parameters": {"chdir": "/"}}
    )
    params = slurm_parameters(cfg.model_construct(**{**dict(cfg), "cluster": bad}), "score")
    with pytest.raises(UserError, match="batch script refused: .*partition.*chdir"):
        check_script_parameters(params, tmp_path / "jobs")
    with pytest.raises(UserError, match="log folder"):
        check_script_parameters(slurm_parameters(cfg, "score"), Path("/tmp/x\n#SBATCH --chdir=/"))


@pytest.mark.parametrize(
    "extra", [{"account": "proj-1", "qos": "normal", "constraint": "a100|h100"}, {"mem_per_gpu": "40G"}]
)
def test_ordinary_options_pass(extra, tmp_path):
    cfg = load_recipe("demo-cpu", [f"cluster.slurm_additional_parameters={json.dumps(extra)}", "cluster.partition=gpu"])
    check_script_parameters(slurm_parameters(cfg, "score", "afterok:12"), tmp_path / "jobs")
