"""score.processes: several local scoring processes share one store's units."""

from llmaudit.finetune.runs import finetune
from llmaudit.jobs.local import score_in_processes
from llmaudit.planning.status import stage_status
from llmaudit.store.units import plan_units
from llmaudit.store.worklog import read_work


def test_two_local_processes_score_every_unit_once(tiny_cfg):
    cfg = tiny_cfg.model_copy(update={"score": tiny_cfg.score.model_copy(update={"processes": 2})})
    store = finetune(cfg, progress=False, echo=lambda *a: None)
    lines = []
    result = score_in_processes(cfg, store, echo=lines.append)
    assert result["processes"] == 2 and "2 scoring processes" in lines[0]
    done = [(w["run"], w["step"], w["quantizer"]) for w in read_work(store.worklog_path)]
    assert sorted(done) == sorted((u.run, u.step, u.quantizer) for u in plan_units(cfg, store))
    # the store keeps the user's setting, not the children's
    assert store.manifest()["config"]["score"]["processes"] == 2
    status = stage_status(store)
    assert not status["score"]["missing"] and not status["score"]["invalid"]
