"""A run's GradInit settings resolved once (RunPlan): the same plan from the command line and
from the task config, the phase run from a plan made by hand, and the single rules it relies on."""
import json
import math

import numpy as np
import pytest
import torch

fairseq = pytest.importorskip("fairseq")
from fairseq import tasks, utils  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (serves fairseq's tasks)
from fairseq_gradinit.core import GradInitConfig, overlapping_pairs  # noqa: E402
from fairseq_gradinit.core.batching import split_draw, tilde_rows  # noqa: E402
from fairseq_gradinit.core.config import LOSS_CHANGE_BOUNDS, default_gamma  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import GLOBAL_SETTINGS, GradInitOptions, PluginOptions  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.plan import RunPlan, build_plan, namespace_error  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.restore import restore_path  # noqa: E402
from fairseq_helpers import make_tiny_bin  # noqa: E402
from fairseq_train import TINY_ONE_LAYER as TINY, parse  # noqa: E402



@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_tiny_bin(tmp_path_factory.mktemp("plandata"), {"train": 120, "valid": 20, "test": 20}, 400)


def test_global_settings_are_read_off_the_interpolations_and_exist_on_the_namespace():
    interpolated = {name for name, f in PluginOptions.__dataclass_fields__.items()
                    if isinstance(f.default, str) and f.default.startswith("${")}
    assert set(GLOBAL_SETTINGS) == interpolated
    assert GLOBAL_SETTINGS["gradinit_train_lr"] == "lr" and GLOBAL_SETTINGS["gradinit_train_optimizer"] == "optimizer"
    ns = parse(["data-bin-not-read", "--task", "translation", *TINY])
    missing = [attr for attr in GLOBAL_SETTINGS.values() if not hasattr(ns, attr)]
    assert missing == []


@pytest.mark.parametrize("extra", [
    ["--lr", "5e-4", "--gradinit-iters", "7"],
    ["--lr", "2e-4", "--gradinit-iters", "3", "--gradinit-eta", "1e-3", "--gradinit-max-tokens", "900",
     "--save-dir", "elsewhere", "--gradinit-tied-embeddings", "per-use", "--gradinit-checkpoint-interval", "2"],
    ["--lr", "0", "--gradinit-iters", "0"],
])
def test_the_command_line_and_the_task_config_give_one_plan(extra):
    ns = parse(["data-bin-not-read", "--task", "translation", *TINY, *extra])
    from_ns = build_plan(ns)
    from_cfg = build_plan(convert_namespace_to_omegaconf(ns).task)
    assert from_ns == from_cfg  # every resolved field
    assert from_ns.config == from_cfg.config
    assert (from_ns.max_tokens, from_ns.derived, from_ns.error, from_ns.config_error) == \
        (from_cfg.max_tokens, from_cfg.derived, from_cfg.error, from_cfg.config_error)
    assert from_ns.save_dir == ("elsewhere" if "elsewhere" in extra else "checkpoints")
    assert from_ns.seed == 3


def test_the_parse_check_reports_the_plans_error():
    ns = parse(["data-bin-not-read", "--task", "translation", *TINY, "--lr", "5e-4", "--gradinit-iters", "2"])
    assert build_plan(ns).error is None and namespace_error(ns) is None
    ns.ddp_backend = "fully_sharded"
    plan = build_plan(ns)
    assert plan.error.startswith("--ddp-backend fully_sharded is not supported") and namespace_error(ns) == plan.error
    ns.ddp_backend, ns.max_tokens = "pytorch_ddp", None
    assert namespace_error(ns).startswith("argument --gradinit-max-tokens:")


def test_a_plan_is_frozen_and_typed():
    plan = build_plan(GradInitOptions(gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=100))
    assert plan.iters == 2 and plan.enabled and plan.config.eta == 1e-3 and plan.max_tokens == 150
    with pytest.raises(AttributeError):  # a frozen dataclass
        plan.error = "x"
    with pytest.raises(AttributeError):
        plan.training.data = "x"
    with pytest.raises(TypeError):
        plan.result_settings["gradinit_tied_embeddings"] = "per-use"
    with pytest.raises(AttributeError):  # no setting is read by its option's name
        _ = plan.gradinit_iters


def test_the_phase_runs_from_a_plan_made_by_hand(tiny_data, tmp_path):
    """The task's run(plan, model, criterion) needs no parser: a plan from Python, a model and a criterion."""
    ns = parse([str(tiny_data), "--task", "translation", *TINY])
    cfg = convert_namespace_to_omegaconf(ns)
    np.random.seed(3)
    utils.set_torch_seed(3)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    assert task.gradinit_result is None  # GradInit off in the config: nothing ran yet
    assert isinstance(task.gradinit_plan, RunPlan) and not task.gradinit_plan.enabled  # built with the model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = build_plan(GradInitOptions(
        gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=300, gradinit_seed=3,
        gradinit_cpu=True, gradinit_save_dir=str(tmp_path / "out"), gradinit_train_subset="train",
        gradinit_valid_subset="valid", gradinit_checkpoint_interval=0))
    assert isinstance(plan, RunPlan) and plan.error is None
    (tmp_path / "out").mkdir()
    result = task.run(plan, model, criterion)
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert len(result.history) == 2 and result.scales and set(result.scales) <= names
    saved = json.loads((tmp_path / "out" / "gradinit.json").read_text())
    assert saved["max_tokens"] == 450 and saved["fingerprint"]["gradinit"]["resolved"]["eta"] == 1e-3
    assert saved["scales"] == pytest.approx(result.scales)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed  # the scales were applied to the weights


def test_a_plan_with_an_error_does_not_run(tiny_data, tmp_path):
    ns = parse([str(tiny_data), "--task", "translation", *TINY])
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    plan = build_plan(GradInitOptions(gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_save_dir=str(tmp_path)))
    assert plan.error.startswith("argument --gradinit-max-tokens:")
    with pytest.raises(SystemExit, match="--gradinit-max-tokens"):
        task.run(plan, model, task.build_criterion(cfg.criterion))
    assert not (tmp_path / "gradinit.json").exists()


def _old_draw_split(idx, overlap):
    """The split of one draw into S and S~ as the plugin made it before it used the core's rule."""
    n = len(idx)
    if n < 2:
        return idx, idx
    n_s = min(n, max(1, int(round(n / (2.0 - overlap)))))
    k = int(round(overlap * n_s))
    s_idx, st_idx = idx[:n_s], idx[n_s - k:n_s - k + n_s]
    if len(st_idx) == 0:
        st_idx = s_idx
    return s_idx, st_idx


def test_the_plugins_draws_split_bit_identically_to_before():
    rng = np.random.RandomState(0)
    for overlap in [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.6, 0.75, 0.9, 0.99, 1.0]:
        for n in range(0, 130):
            idx = rng.permutation(n)
            (a, b), (c, d) = split_draw(n, overlap)
            old_s, old_st = _old_draw_split(idx, overlap)
            assert np.array_equal(idx[a:b], old_s) and np.array_equal(idx[c:d], old_st), (n, overlap)


def test_one_meaning_of_overlap_for_both_pairings():
    """|S ∩ S~| = overlap x |S| whether S~ comes from the same draw (plugin) or runs into the next batch (core)."""
    for overlap in (0.0, 0.5, 0.75):
        (a, b), (c, d) = split_draw(60, overlap)
        assert (b - a) - max(0, b - c) == (b - a) - int(round(overlap * (b - a)))
        batches = [torch.arange(i * 8, i * 8 + 8) for i in range(3)]
        for pair in overlapping_pairs(batches, overlap):
            shared = len(set(pair.s.tolist()) & set(pair.s_tilde.tolist()))
            assert shared == int(round(overlap * 8)) and len(pair.s_tilde) == 8
        assert tilde_rows(8, overlap) == (8 - int(round(overlap * 8)), 16 - int(round(overlap * 8)))


def test_one_gamma_rule_with_the_engines_and_the_plugins_bounds():
    assert GradInitConfig(optimizer="adam", eta=1e-3).resolved_gamma == pytest.approx(
        default_gamma("adam", 1e-3, LOSS_CHANGE_BOUNDS["engine"]["adam"])) == pytest.approx(100.0)
    plugin = build_plan(GradInitOptions(gradinit_iters=1, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=10))
    # the plugin's Adam default measures gamma at the init instead (the authors' rule gave 1/eta = 1000 here)
    assert (plugin.config.gamma, plugin.config.gamma_init_factor) == (None, 2.0)
    assert default_gamma("adam", 1e-3, LOSS_CHANGE_BOUNDS["fairseq"]["adam"]) == pytest.approx(1000.0)
    sgd = build_plan(GradInitOptions(gradinit_iters=1, gradinit_train_lr=[0.15], gradinit_train_optimizer="sgd",
                                     gradinit_train_max_tokens=10))
    assert sgd.config.gamma == pytest.approx(math.sqrt(LOSS_CHANGE_BOUNDS["fairseq"]["sgd"] / 0.15)) == pytest.approx(1.0)


def test_one_loss_function_type():
    from fairseq_gradinit.core import norms_and_spread, runtime
    from fairseq_gradinit.vision import api

    assert norms_and_spread.LossFn is runtime.LossFn and api.LossFn is runtime.LossFn


def test_the_restore_decision_is_the_save_dir_s_when_the_run_starts(tmp_path):
    """Not a setting: the same plan decides from the save dir as it is when asked (the criterion's)."""
    settings = dict(gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=100,
                    gradinit_save_dir=str(tmp_path), gradinit_restore_file="checkpoint_last.pt")
    plan = build_plan(GradInitOptions(**settings))
    assert restore_path(plan.checkpoints) is None
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    assert restore_path(plan.checkpoints) == str(tmp_path / "checkpoint_last.pt")


def test_applying_an_init_file_measures_its_health_and_leaves_the_random_state(tiny_data, tmp_path):
    """An init file's health is measured on a GradInit batch, without touching torch's or numpy's random
    state: training from the file stays the training of the run that computed it."""
    ns = parse([str(tiny_data), "--task", "translation", *TINY])
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    scales = {n: 0.5 for n, p in model.named_parameters() if bool(p.detach().count_nonzero())}
    init = tmp_path / "scales.json"
    init.write_text(json.dumps({"scales": scales}))
    out = tmp_path / "out"
    out.mkdir()
    plan = build_plan(GradInitOptions(
        gradinit_init_file=str(init), gradinit_init_clamp="[('norm', 0.6, None)]", gradinit_train_lr=[5e-4],
        gradinit_train_max_tokens=300, gradinit_seed=3, gradinit_cpu=True, gradinit_save_dir=str(out),
        gradinit_train_subset="train", gradinit_valid_subset="valid", gradinit_checkpoint_interval=0))
    assert plan.error is None, plan.error
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    task.run(plan, model, criterion)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np.random.get_state(), np_state))
    health = json.loads((out / "gradinit.json").read_text())["health"]
    assert health["batch"]["sentences"] > 0 and health["norms"]
    assert all(n["gain_after"] > 0 for n in health["norms"])


def test_the_task_resolves_its_plan_once_when_it_builds_the_model(tiny_data, monkeypatch):
    """The model's build resolves the plan (before the guard and the model checks read it); the monitor
    is made from it and the criterion reuses the same object: one build per run, none at the task's setup."""
    from fairseq_gradinit.fairseq_plugin.registration import hook

    built = []
    monkeypatch.setattr(hook, "build_plan", lambda cfg: built.append(build_plan(cfg)) or built[-1])
    cfg = convert_namespace_to_omegaconf(parse([str(tiny_data), "--task", "translation", *TINY,
                                                "--gradinit-monitor-interval", "3", "--save-dir", "elsewhere"]))
    task = tasks.setup_task(cfg.task)
    assert built == []
    task.build_model(cfg.model)
    assert len(built) == 1 and task.gradinit_plan is built[0] and task.gradinit_plan.monitor_interval == 3
    assert task.gradinit_monitor.interval == 3 and task.gradinit_monitor.path == "elsewhere/monitor.jsonl"
    task.build_criterion(cfg.criterion)
    assert len(built) == 1 and task.gradinit_plan is built[0]
