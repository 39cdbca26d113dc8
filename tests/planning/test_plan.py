"""`llmaudit plan`: its counts are exactly what finetune and score then do."""

import json

import pytest

from llmaudit.analyze.attacks.registry import resolve_attacks
from llmaudit.common.io import read_json
from llmaudit.finetune.runs import finetune
from llmaudit.planning.plan import format_plan, make_plan
from llmaudit.score.stage import score
from llmaudit.store.worklog import read_work
from tests.conftest import TINY_OVERRIDES


def test_plan_counts_match_the_work_done(tiny_cfg):
    # fp32 scored second: the first final unit of each run computes the KL reference, fp32 then captures its own
    tiny_cfg = tiny_cfg.model_copy(
        update={"score": tiny_cfg.score.model_copy(update={"quantizers": ["uniform-4", "fp32", "sign"]})}
    )
    plan = make_plan(tiny_cfg, device="cpu", echo=lambda *a: None)
    work = plan["workload"]
    assert not tiny_cfg.resolved_output_dir().exists()  # planning writes nothing
    store = finetune(tiny_cfg, progress=False, echo=lambda *a: None)
    score(tiny_cfg, store, progress=False, echo=lambda *a: None)
    done = [read_json(store.run_done_path(r)) for r in range(tiny_cfg.train.runs)]
    assert work["steps_per_run"] == [d["steps"] for d in done]
    assert work["members_per_run"] == [d["n_train"] for d in done]
    assert work["train_tokens"] == sum(d["train_tokens"] for d in done)
    assert work["train_padded_tokens"] == sum(d["train_padded_tokens"] for d in done)
    log = read_work(store.worklog_path)
    assert work["units"] == len(log) == len({(w["run"], w["step"], w["quantizer"]) for w in log})
    assert work["score_tokens"] == sum(w["tokens"] for w in log)
    by_kind = {w["samples"] for w in log}
    assert by_kind == {tiny_cfg.data.val_size, tiny_cfg.data.val_size + tiny_cfg.data.pool_size}
    # the utility columns' extra work: reference passes, compared positions, generation prompts; at most the new tokens
    extra = {k: sum(w.get(k, 0) for w in log) for k in ("reference_tokens", "divergence_positions")}
    extra["generation_prompt_tokens"] = sum(w.get("generation_prompt_tokens", 0) for w in log)
    assert extra == {k: work[k] for k in extra}
    assert work["reference_tokens"] == tiny_cfg.train.runs * work["unit_tokens"]["val"]  # one pass per final checkpoint
    assert work["divergence_positions"] > 0 and work["generation_units"] == tiny_cfg.train.runs * 3
    generated = sum(w.get("generated_tokens", 0) for w in log)
    assert 0 < generated <= work["generated_tokens_max"] == work["generation_units"] * 2 * 8
    # every figure of the estimate is positive and the text names them
    assert all(v > 0 for k, v in plan["estimate"].items() if k.endswith("_s"))
    text = format_plan(plan)
    assert f"scoring units   {work['units']}" in text and "finetune" in text
    assert f"KL: {work['divergence_positions']:,} positions compared" in text
    # the report is priced from the analysis measured here, at the recipe's runs and attacks (analyze.cost)
    analysis = plan["analysis"]
    assert analysis["runs"] == tiny_cfg.train.runs and tuple(analysis["attacks"]) == resolve_attacks(
        tiny_cfg.attack.attacks
    )
    assert "report: the analysis measured on this CPU" in text
    json.dumps(plan)  # --json is plain JSON


def test_plan_for_a_named_gpu_uses_its_published_peak(tiny_cfg):
    h100 = make_plan(tiny_cfg, device="h100", jobs=16, echo=lambda *a: None)
    a100 = make_plan(tiny_cfg, device="a100", echo=lambda *a: None)
    assert h100["device"] == "h100" and "989 TFLOP/s" in h100["throughput"]["source"]["score"]
    ratio = h100["throughput"]["score_tokens_per_s"] / a100["throughput"]["score_tokens_per_s"]
    assert abs(ratio - 989 / 312) < 1e-9
    assert h100["estimate"]["parallel_total_s"] < h100["estimate"]["total_s"]
    assert any("report stage runs on a CPU" in a for a in h100["assumptions"])


def test_offline_plan_of_a_hub_recipe_prices_the_published_shape(monkeypatch, tmp_path):
    """No hub here: the Qwen2.5 recipe is priced from the model's published shape, with the stand-in
    tokenizer and offline records, and the plan says so."""
    from llmaudit.config import load_recipe

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    cfg = load_recipe(
        "qwen2.5-0.5b-smolinstruct",
        ["data.pool_size=64", "data.val_size=16", "train.runs=2", "score.quantizers=[bf16, gptq-4]"],
    )
    plan = make_plan(cfg, device="h100", jobs=2, echo=lambda *a: None)
    assert 490e6 < plan["workload"]["model_parameters"] < 500e6  # Qwen2.5-0.5B: 494M with tied embeddings
    assert len(plan["assumptions"]) == 2 and "published shape" in plan["assumptions"][0]
    assert "report stage runs on a CPU" in plan["assumptions"][1]
    assert plan["workload"]["runs"] == 2 and plan["workload"]["gptq_calibrations"] > 0
    text = format_plan(plan)
    assert "assumption      Qwen/Qwen2.5-0.5B-Instruct or its data could not be reached" in text


@pytest.mark.slow  # three plans (each a few-second calibration) and the store's data draw: about 20 s
def test_plan_where_a_store_of_fewer_runs_exists_prices_every_run_and_says_why(tiny_cfg):
    """The README's order of commands: the demo's store exists, then `llmaudit plan demo-cpu train.runs=12`. The
    store holds 3 runs' masks, the recipe asks for 5: the plan prices all 5 (a new experiment: `finetune`
    refuses to add runs to that store) and says so in one line naming the key that differs."""
    from llmaudit.finetune.experiment import prepare_experiment
    from llmaudit.store.run_store import RunStore
    from tests.conftest import run_cli

    store = RunStore(tiny_cfg.resolved_output_dir())
    prepare_experiment(tiny_cfg, store, echo=lambda *a: None)  # the store's manifest and masks, no training
    more = tiny_cfg.model_copy(update={"train": tiny_cfg.train.model_copy(update={"runs": 5})})
    plan = make_plan(more, device="cpu", echo=lambda *a: None)
    work = plan["workload"]
    assert work["runs"] == 5 and len(work["members_per_run"]) == 5 and len(work["steps_per_run"]) == 5
    (line,) = plan["assumptions"]
    assert "train.runs" in line and "new experiment" in line and str(store.root) in line
    # the same experiment: the store's own masks are priced, with nothing to say
    same = make_plan(tiny_cfg, device="cpu", echo=lambda *a: None)
    assert same["assumptions"] == [] and same["workload"]["runs"] == 3
    # and through the command line, as the README's user types it
    args = ["plan", "demo-cpu", *TINY_OVERRIDES, f"output_dir={store.root}", "train.runs=5", "--json"]
    code, out, err = run_cli(args)
    assert code == 0, err
    assert json.loads(out)["workload"]["runs"] == 5


def test_local_processes_shorten_a_stage_on_a_cpu_each_measured_on_its_share_of_the_cores(monkeypatch):
    from llmaudit.common.runtime import available_cores
    from llmaudit.config import load_recipe
    from llmaudit.planning.throughput import local_parallelism, processes_note, stage_threads

    cores = available_cores()
    assert local_parallelism(2, 8, on_cpu=True) == min(2, cores)
    assert local_parallelism(4, 1, on_cpu=True) == 1  # one run: nothing to share
    assert local_parallelism(2, 8, on_cpu=False) == 1  # the processes share the GPU the probe used
    monkeypatch.setenv("LLMAUDIT_THREADS", "8")  # 8 cores to share, as jobs.local shares them
    verdict = load_recipe("smollm2-135m-verdict")  # score.processes 2, train.processes 1
    assert stage_threads(verdict, runs=6) == {"train": None, "score": 4}  # what jobs.local gives each child
    wide = verdict.model_copy(update={"train": verdict.train.model_copy(update={"processes": 3})})
    assert stage_threads(wide, runs=6) == {"train": 2, "score": 4}
    assert stage_threads(wide, runs=1)["train"] is None  # one run trains in one process
    assert stage_threads(load_recipe("demo-cpu"), runs=8) == {"train": None, "score": None}  # built-in: one thread
    assert processes_note({"train_processes": 1, "score_processes": 1}) == ""
    assert (
        processes_note({"train_processes": 2, "score_processes": 1}) == " (2 training and 1 scoring processes at once)"
    )
