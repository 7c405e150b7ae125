"""The GradInit phase takes a run object, never the task: data flows from fairseq to the task to the run
to the phase. Read from the source (no phase function takes a task or touches one) and run: the phase
computes from a run whose batches come from a plain list as it computes from the task's own run."""
import ast
import dataclasses
import inspect
import json

import numpy as np
import pytest
import torch

pytest.importorskip("fairseq")
from fairseq import tasks, utils  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (serves fairseq's tasks)
from fairseq_gradinit.fairseq_plugin.phase import compute as phase  # noqa: E402
from fairseq_gradinit.fairseq_plugin.data.loss import mean_loss_fn  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import GradInitOptions  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan  # noqa: E402
from fairseq_gradinit.fairseq_plugin.phase.run import GradInitRun  # noqa: E402
from fairseq_train import TINY_ONE_LAYER as TINY, parse  # noqa: E402


def test_no_function_of_the_phase_takes_or_touches_a_task():
    tree = ast.parse(inspect.getsource(phase))
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert {"run_locked", "compute", "apply_saved"} <= {f.name for f in functions}
    taking = [f.name for f in functions for a in f.args.args + f.args.kwonlyargs if a.arg == "task"]
    touching = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "task"]
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module in ("hook", "task")]
    assert (taking, touching, imported) == ([], [], [])
    for name in ("run_locked", "compute"):
        assert list(inspect.signature(getattr(phase, name)).parameters) == ["run", "model"]


def test_no_module_of_the_phase_room_takes_or_names_a_task():
    """The whole room (the phase, its run, state, lock, fingerprint, signals and run log), not only the
    phase's own module: a task enters the run only as the data it hands over (its batches)."""
    from pathlib import Path

    found = []
    for path in sorted(Path(phase.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.name}:{f.name}" for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                  for a in f.args.args + f.args.kwonlyargs if a.arg == "task"]
        found += [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "task"]
    assert len(list(Path(phase.__file__).parent.glob("*.py"))) >= 7 and not found, found


def _model_and_criterion(data):
    cfg = convert_namespace_to_omegaconf(parse([str(data), "--task", "translation", *TINY]))
    np.random.seed(3)
    utils.set_torch_seed(3)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return task, model, task.build_criterion(cfg.criterion)


def _plan(save_dir):
    save_dir.mkdir()
    return build_plan(GradInitOptions(
        gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=300, gradinit_seed=3,
        gradinit_cpu=True, gradinit_save_dir=str(save_dir), gradinit_train_subset="train",
        gradinit_valid_subset="valid", gradinit_checkpoint_interval=0))


def test_the_phase_runs_from_a_run_object_and_returns_its_result(tiny_data, tmp_path):
    task, model, criterion = _model_and_criterion(tiny_data)
    run = task.gradinit_run(_plan(tmp_path / "a"), model, criterion)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.plan = None
    assert run.result_path == str(tmp_path / "a" / "gradinit.json") and run.fingerprint["gradinit"]
    drawn = run.batches.pairs(run.plan.config.overlap, torch.device("cpu"))
    recorded = [next(drawn) for _ in range(2)]
    drawn.close()
    result = phase.run_locked(run, model)
    assert task.gradinit_result is None  # returned, not stored on the task
    saved = json.loads((tmp_path / "a" / "gradinit.json").read_text())
    assert saved["fingerprint"] == json.loads(json.dumps(run.fingerprint)) and len(result.history) == 2

    # The same phase from a run that no task built: its batches a plain list of the same pairs.
    _, fresh, criterion = _model_and_criterion(tiny_data)

    @dataclasses.dataclass(frozen=True)
    class Listed:
        pairs_drawn: tuple

        def pairs(self, overlap, device, rank=0, world=1, skip=0):
            yield from self.pairs_drawn[skip:]

    plain = GradInitRun(plan=_plan(tmp_path / "b"), fingerprint={"made": "by hand"}, batches=Listed(tuple(recorded)),
                        loss_fn=mean_loss_fn(criterion), criterion=criterion, valid_split_error=None)
    other = phase.run_locked(plain, fresh)
    assert other.scales == pytest.approx(result.scales, rel=1e-6)
    assert json.loads((tmp_path / "b" / "gradinit.json").read_text())["fingerprint"] == {"made": "by hand"}


def test_every_check_is_registered_in_one_place_with_when_it_runs():
    from fairseq_gradinit.fairseq_plugin.settings import validation
    from fairseq_gradinit.fairseq_plugin.models.wskip import wskip_argument_error

    names = {when: [c.name for c in validation.checks(when)] for when in validation.WHEN}
    assert names["phase"] == ["precision", "validation split"]  # the cheap check first
    assert names["settings"] == ["options", "distributed setup", "batch tokens"]
    assert names["training setup"] == ["optimizer", "save dir", "train split", "checkpoint paths", "data files"]
    assert [c.fn for c in validation.checks("arguments")].count(wskip_argument_error) == 1
    validation.check_every_parse(wskip_argument_error)  # again: no effect
    assert [c.fn for c in validation.checks("arguments")].count(wskip_argument_error) == 1
    with pytest.raises(ValueError, match="unknown point"):
        validation.register_check("whenever")


def test_a_check_raises_one_error_type_and_the_task_ends_it_in_one_line(tiny_data, tmp_path):
    from fairseq_gradinit.fairseq_plugin.errors import GradInitError, GradInitStop
    from fairseq_gradinit.fairseq_plugin.settings.validation import require

    with pytest.raises(GradInitError, match="^argument --gradinit-iters: invalid value -1"):
        require("settings", build_plan(GradInitOptions(gradinit_iters=-1)))
    task, model, criterion = _model_and_criterion(tiny_data)
    plan = build_plan(GradInitOptions(gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_save_dir=str(tmp_path)))
    with pytest.raises(GradInitStop) as stop:  # the task's entry point is the boundary
        task.run(plan, model, criterion)
    assert stop.value.code == "gradinit: error: " + plan.error and "\n" not in stop.value.code


def test_only_the_boundary_turns_an_error_into_an_exit():
    """No module of the adapter but errors.py makes a GradInitStop; SystemExit only for a signal's exit."""
    from pathlib import Path

    root = Path(phase.__file__).parents[1]  # the plugin
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("GradInitStop", "SystemExit"):
                found.append(f"{path.relative_to(root)}:{node.func.id}")
    assert found == ["errors.py:GradInitStop", "phase/compute.py:SystemExit"], found


def test_the_plan_is_built_in_one_place_per_entry_point_with_no_fallbacks():
    """A run's plan comes from the task (its ``gradinit_plan``, resolved once when the model is built and
    reused by the criterion); the parse-time checks and a fingerprint of a command line (no task) build
    their own. Nothing downstream rebuilds it."""
    from pathlib import Path

    root = Path(phase.__file__).parents[1]  # the plugin
    calls = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            calls += [f"{path.stem}.{fn.name}" for n in ast.walk(fn)
                      if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "build_plan"]
    assert sorted(calls) == ["hook.gradinit_plan", "plan.legacy_task_parse_error", "plan.namespace_error",
                            "provenance.gradinit_fingerprint"]
