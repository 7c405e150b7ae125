"""One plan per run, resolved once; a run handed to the phase holds data only; the engine's refusals are
structured (:class:`~fairseq_gradinit.core.errors.ConfigError`) and the plugin words them without reading
their text."""
import dataclasses
import json
import pickle
import re
import types

import numpy as np
import pytest
import torch

pytest.importorskip("fairseq")
from fairseq import tasks, utils  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from fairseq.tasks import FairseqTask  # noqa: E402

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (serves fairseq's tasks)
from fairseq_gradinit.core import ConfigError, GradInitConfig, MetaInitConfig  # noqa: E402
from fairseq_gradinit.fairseq_plugin.phase import compute, provenance  # noqa: E402
from fairseq_gradinit.fairseq_plugin.registration import hook  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings import plan as plan_module  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import GradInitOptions  # noqa: E402
from fairseq_train import TINY_ONE_LAYER as TINY, parse  # noqa: E402


def _counting(monkeypatch):
    """Count what resolving a plan costs (deriving the engine's config, reading an init file) and record
    every plan built, by where it was asked for: the parse-time check (``plan``), the task (``hook``) and a
    fingerprint without a task (``provenance``)."""
    counts = {"derived": 0, "read": 0, "phase reads": 0}
    plans = {"plan": [], "hook": [], "provenance": []}

    def count(key, fn):
        def counted(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)
        return counted

    monkeypatch.setattr(plan_module, "gradinit_config_from_task", count("derived", plan_module.gradinit_config_from_task))
    monkeypatch.setattr(plan_module, "read_init_file", count("read", plan_module.read_init_file))
    monkeypatch.setattr(compute, "read_init_file", count("phase reads", compute.read_init_file))
    build = plan_module.build_plan

    def recorded(where):
        def build_recorded(source):
            plans[where].append(build(source))
            return plans[where][-1]
        return build_recorded

    for where, module in (("plan", plan_module), ("hook", hook), ("provenance", provenance)):
        monkeypatch.setattr(module, "build_plan", recorded(where))
    return counts, plans


def _one_run(argv):
    """What fairseq-train does up to its first update: parse (the parse-time check), the config, the
    task, the model and the criterion (where GradInit runs);
    then the fingerprint of the same config, given the task's plan."""
    cfg = convert_namespace_to_omegaconf(parse(argv))
    np.random.seed(3)
    utils.set_torch_seed(3)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    task.build_criterion(cfg.criterion)
    fp = provenance.gradinit_fingerprint(cfg, plan=task.gradinit_plan)
    return task, model, fp


def _recording_runs(monkeypatch):
    ran = []
    run_locked = hook.run_locked
    monkeypatch.setattr(hook, "run_locked", lambda run, model: ran.append(run) or run_locked(run, model))
    return ran


def test_one_run_resolves_its_plan_once_and_reads_its_init_file_once(tiny_data, tmp_path, monkeypatch):
    from fairseq_gradinit.fairseq_plugin.phase.lock import release_save_dirs

    argv = [str(tiny_data), "--task", "translation", *TINY, "--lr", "5e-4"]
    ran = _recording_runs(monkeypatch)
    counts, plans = _counting(monkeypatch)
    try:
        task, _, fp = _one_run(argv + ["--gradinit-iters", "2", "--save-dir", str(tmp_path / "a")])
    finally:
        release_save_dirs()
    assert task.gradinit_result is not None and len(task.gradinit_result.history) == 2  # GradInit ran
    # The task builds one plan and hands that object to the phase and the fingerprint; the parse-time
    # check resolved the command line it checked into an equal plan; nothing else builds one.
    assert [len(plans[w]) for w in ("plan", "hook", "provenance")] == [1, 1, 0]
    assert plans["hook"][0] is task.gradinit_plan and ran[0].plan is task.gradinit_plan
    assert plans["plan"][0] == task.gradinit_plan and plans["plan"][0] is not task.gradinit_plan
    assert fp["gradinit"] == ran[0].fingerprint["gradinit"]  # the phase's settings, from the same plan
    # Derived once by the task's plan, once by the parser's.
    assert counts == {"derived": 2, "read": 0, "phase reads": 0}

    ran.clear()
    counts, plans = _counting(monkeypatch)
    init_file = str(tmp_path / "a" / "gradinit.json")
    try:
        task, model, _ = _one_run(argv + ["--gradinit-init-file", init_file, "--save-dir", str(tmp_path / "b")])
    finally:
        release_save_dirs()
    assert [len(plans[w]) for w in ("plan", "hook", "provenance")] == [1, 1, 0]
    assert ran[0].plan is task.gradinit_plan and plans["plan"][0] == task.gradinit_plan
    # Read by the parse-time check (to refuse a bad file) and by the task's plan; the phase applies the plan's record.
    assert counts == {"derived": 2, "read": 2, "phase reads": 0}
    assert task.gradinit_plan.init_record["scales"] == json.loads(open(init_file).read())["scales"]

    # Another run of this process with the same settings, after the init file was written again: read again.
    saved = json.loads(open(init_file).read())
    saved["scales"] = {name: 2 * s for name, s in saved["scales"].items()}
    with open(init_file, "w") as f:
        json.dump(saved, f)
    counts, plans = _counting(monkeypatch)
    again = plan_module.build_plan(convert_namespace_to_omegaconf(parse(
        argv + ["--gradinit-init-file", init_file, "--save-dir", str(tmp_path / "b")])).task)
    assert counts["read"] == 2 and again is not task.gradinit_plan  # the parse-time check's and this one
    assert again.init_record["scales"] == saved["scales"]


def test_no_module_keeps_plans():
    """The plan is the task's (or its caller's): after plans are built, no module of the plugin holds one
    (no cache between calls), and a plan is read by its typed fields only."""
    import sys

    built = [plan_module.build_plan(GradInitOptions(gradinit_iters=i, gradinit_train_lr=[5e-4],
                                                    gradinit_train_max_tokens=300)) for i in (0, 2)]
    assert built[0] != built[1]
    held = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("fairseq_gradinit.fairseq_plugin"):
            continue
        for attr, value in vars(module).items():
            inside = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set)) else ()
            if isinstance(value, plan_module.RunPlan) or any(isinstance(v, plan_module.RunPlan) for v in inside):
                held.append(f"{name}.{attr}")
    assert held == []
    assert not hasattr(plan_module.RunPlan, "__getattr__") and not hasattr(plan_module.RunPlan, "setting")


def test_the_plan_says_whether_gradinit_is_on():
    common = dict(gradinit_train_lr=[5e-4], gradinit_train_max_tokens=300)
    off = plan_module.build_plan(GradInitOptions(gradinit_iters=0, **common))
    on = plan_module.build_plan(GradInitOptions(gradinit_iters=3, **common))
    assert (off.enabled, off.computes, on.enabled, on.computes) == (False, False, True, True)
    fields = {f.name for f in dataclasses.fields(plan_module.RunPlan)}
    assert {"enabled", "computes", "iters", "init_record"} <= fields


def _walk(value, path, seen):
    """(path, value) of every object inside a run: dataclass fields, mappings and sequences, not the
    inside of fairseq's criterion or dataset (they are fairseq's, and a criterion keeps its task)."""
    if id(value) in seen:
        return
    seen.add(id(value))
    yield path, value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name), f"{path}.{f.name}", seen)
    elif isinstance(value, (dict, types.MappingProxyType)):
        for k, v in value.items():
            yield from _walk(v, f"{path}[{k!r}]", seen)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:50]):
            yield from _walk(v, f"{path}[{i}]", seen)


def test_a_run_handed_to_the_phase_holds_data_no_closure_and_no_task(tiny_data, tmp_path):
    cfg = convert_namespace_to_omegaconf(parse([str(tiny_data), "--task", "translation", *TINY]))
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    (tmp_path / "out").mkdir()
    plan = plan_module.build_plan(GradInitOptions(
        gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=300, gradinit_seed=3,
        gradinit_cpu=True, gradinit_save_dir=str(tmp_path / "out"), gradinit_train_subset="train",
        gradinit_valid_subset="valid"))
    run = task.gradinit_run(plan, model, criterion)
    found = list(_walk(run, "run", set()))
    assert len(found) > 10 and any(p == "run.batches.batches[0]" for p, _ in found)  # the walk went inside
    tasks_inside = [p for p, v in found if isinstance(v, FairseqTask)]
    closures = [p for p, v in found if isinstance(v, types.FunctionType)]  # lambdas, nested functions
    bound = [p for p, v in found if isinstance(v, types.MethodType)]
    assert (tasks_inside, closures, bound) == ([], [], [])
    assert run.valid_split_error is None and run.batches_error is None  # found before the handover
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.batches = None
    # The batches are the task's own: the same first pair as the task draws itself.
    mine, theirs = run.batches.pairs(0.5, torch.device("cpu")), task.gradinit_pairs(model, 450, 0.5, torch.device("cpu"))
    a, b = next(mine), next(theirs)
    mine.close()
    theirs.close()
    assert torch.equal(a.s["net_input"]["src_tokens"], b.s["net_input"]["src_tokens"])


_OLD_WORDING = re.compile(r"^GradInitConfig\.(\w+)=(.*?) is invalid: (.*)$", re.S)


def _worded_from_text(message, eta_from_lr):
    """How the plugin worded an engine refusal before it was structured: by parsing its text."""
    name, value, rest = _OLD_WORDING.match(message).groups()
    flag = "--lr (the default of --gradinit-eta)" if name == "eta" and eta_from_lr else \
        "--gradinit-" + name.replace("_", "-")
    return f"argument {flag}: invalid value {value}: {rest}"


def test_a_config_error_carries_its_field_value_and_expected_range():
    with pytest.raises(ValueError) as caught:  # a ValueError: `except ValueError` still catches it
        GradInitConfig(eta=0.0)
    e = caught.value
    assert isinstance(e, ConfigError)
    assert (e.owner, e.field, e.value, e.expected) == (
        "GradInitConfig", "eta", 0.0, "a finite number > 0 (the training learning rate)")
    assert str(e) == "GradInitConfig.eta=0.0 is invalid: expected a finite number > 0 (the training learning rate)"
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.field, back.value) == (ConfigError, str(e), "eta", 0.0)
    with pytest.raises(ConfigError) as meta:
        MetaInitConfig(eps=float("inf"))
    assert (meta.value.owner, meta.value.field) == ("MetaInitConfig", "eps")


@pytest.mark.parametrize("settings", [
    dict(gradinit_train_lr=[0.0]),  # eta from --lr
    dict(gradinit_eta=-1.0),
    dict(gradinit_gamma=-2.0),
    dict(gradinit_overlap=0.3, gradinit_pairs="authors"),
    dict(gradinit_min_scale=2.0),
    dict(gradinit_unstepped_uses="("),
])
def test_the_plugin_words_an_engine_refusal_as_it_did_from_its_text(settings):
    from fairseq_gradinit.fairseq_plugin.settings.option_values import gradinit_config_from_task

    options = GradInitOptions(**{**dict(gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=300),
                                 **settings})
    with pytest.raises(ConfigError) as caught:
        gradinit_config_from_task(options)
    expected = _worded_from_text(str(caught.value), eta_from_lr="gradinit_eta" not in settings)
    assert plan_module.build_plan(options).error == expected and expected.startswith("argument --")
