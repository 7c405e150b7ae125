"""The fairseq plugin refuses, in one line and before any work: scales that float32 makes 0 or inf, scales whose gradient is not
finite, the simulated Adam betas, settings fairseq trips over before any work, a report input without its
config or with a history that is no list, strict JSON, a second Ctrl-C at exit. docs/reliability.md
("Numbers that do not survive their dtype, damaged saved states ...")."""
import json
import math
import types

import pytest

pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402

from fairseq_gradinit.fairseq_plugin.errors import GradInitError  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.init_file import read_init_file  # noqa: E402
from fairseq_train import TINY_MODEL  # noqa: E402


def _parse(argv):
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


@pytest.mark.parametrize("scale, words", [(1e-50, "is 0 in torch.float32"), (1e39, "is inf in torch.float32")])
def test_an_init_file_scale_that_float32_makes_zero_or_inf_is_refused_when_parsed(tmp_path, scale, words):
    path = tmp_path / "gradinit.json"
    path.write_text(json.dumps({"scales": {"encoder.layers.0.fc1.weight": scale}}))
    # before: accepted; 1e-50 made the weight all zeros (around the 'no 0 on a weight' rule), 1e39 inf
    with pytest.raises(ValueError, match=f"--gradinit-init-file {path}: the scale .* of "
                                         f"'encoder.layers.0.fc1.weight' {words}"):
        read_init_file(str(path))


def test_scales_whose_gradient_is_not_finite_are_never_written_or_applied(tmp_path):
    from fairseq_gradinit.fairseq_plugin.features.health import nonfinite_blocks
    from fairseq_gradinit.fairseq_plugin.phase.compute import _refuse_nonfinite_final_scales

    health = {"blocks": [{"name": "encoder.layers.0", "rms_after": 0.5},
                         {"name": "decoder.layers.1", "rms_after": float("nan")},
                         {"name": "decoder.output", "rms_after": math.inf}]}
    assert nonfinite_blocks(health) == ["decoder.layers.1", "decoder.output"]
    # before: written and applied; training then died in fairseq's "gradients are Nan/Inf" traceback
    with pytest.raises(GradInitError, match=r"the loss gradient at the final scales is not finite on the last "
                                            r"GradInit batch \(in 2 blocks.*gradinit.json was not written and "
                                            r"training did not start. Lower --gradinit-lr"):
        _refuse_nonfinite_final_scales(health, str(tmp_path / "gradinit.json"), 0, 1)
    _refuse_nonfinite_final_scales({"blocks": health["blocks"][:1]}, "x", 0, 1)
    _refuse_nonfinite_final_scales({"verdict": "unknown"}, "x", 0, 1)  # the health check failed: nothing to judge


def test_the_simulated_adam_betas_are_said_where_they_are_not_the_trainings():
    from fairseq_gradinit.core import GradInitConfig
    from fairseq_gradinit.fairseq_plugin.phase.compute import simulated_betas_note

    def plan(betas, optimizer="adam"):
        return types.SimpleNamespace(training=types.SimpleNamespace(adam_betas=betas, optimizer=optimizer))

    cfg = GradInitConfig(lookahead_steps=4)
    # before: (0.9, 0.98) simulated without a word under --adam-betas '(0.9, 0.999)'
    assert simulated_betas_note(plan("(0.9, 0.999)"), cfg) == (
        "the objective simulates 4 Adam steps with betas (0.9, 0.98), training uses (0.9, 0.999): "
        "--gradinit-lookahead-betas '(0.9, 0.999)' simulates its steps")
    assert simulated_betas_note(plan((0.9, 0.999)), cfg) is not None  # the plan holds fairseq's betas as a tuple
    assert simulated_betas_note(plan(None), cfg) is not None  # fairseq's default (0.9, 0.999)
    assert simulated_betas_note(plan("(0.9, 0.98)"), cfg) is None
    assert simulated_betas_note(plan("(0.9, 0.999)", "sgd"), cfg) is None
    assert simulated_betas_note(plan("(0.9, 0.999)"), GradInitConfig(lookahead_steps=1)) is None


@pytest.mark.parametrize("extra, expected", [
    (["--checkpoint-activations"], "argument --checkpoint-activations: not allowed with --gradinit-iters 5: GradInit "
                                   "differentiates gradients"),
    (["--offload-activations"], "argument --offload-activations: not allowed with --gradinit-iters 5"),
    (["--seed", "-1"], "argument --seed: invalid value -1: expected an integer in [0, 4294967295]"),
    (["--seed", "4294967296"], "argument --seed: invalid value 4294967296: expected an integer in [0, 4294967295]"),
    (["--save-dir", "/tmp/" + "s" * 300], "argument --save-dir /tmp/sss"),
    (["--gradinit-constraint-grad", "finite_difference", "--gradinit-fd-eps", "1e-30"],
     "argument --gradinit-fd-eps: invalid value 1e-30"),
])
def test_settings_that_fail_before_or_in_the_first_iteration_are_refused_when_parsed(extra, expected, capsys):
    argv = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "5"]
    # before: a traceback (fairseq's checkpointing, numpy's seed, fairseq's save-dir check) or scales all 1.0
    with pytest.raises(SystemExit) as exc:
        _parse(argv + extra)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {expected}" in err, err[-600:]
    assert err.count("error:") == 1 and "Traceback" not in err
    _parse(["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", *extra[:1]]
           if extra[0] in ("--checkpoint-activations", "--offload-activations") else
           ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3"])  # GradInit off: fairseq's


def test_data_a_run_cannot_read_as_asked_is_refused_when_parsed(tiny_data, tmp_path, capsys):
    base = ["--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "5"]
    with pytest.raises(SystemExit):  # before: fairseq's traceback once the plugin had loaded
        _parse([str(tiny_data), *base, "--dataset-impl", "raw"])
    assert "error: argument --dataset-impl: raw reads text files, but" in capsys.readouterr().err
    two = tmp_path / "two"
    two.mkdir()
    (two / "dict.de.txt").write_text("hallo 3\n")
    (two / "dict.en.txt").write_text("hello 3\n")
    with pytest.raises(SystemExit):  # TINY_MODEL shares all embeddings
        _parse([str(two), *base, "--source-lang", "de", "--target-lang", "en"])
    assert "error: argument --share-all-embeddings: " in capsys.readouterr().err


def test_a_dictionary_shorter_than_the_ids_of_the_split_is_refused_when_parsed(tiny_data, tmp_path, capsys):
    import shutil

    data = tmp_path / "bin"
    shutil.copytree(tiny_data, data)
    for lang in ("de", "en"):  # the joined dictionary, cut to 10 entries: the split's ids go far beyond
        path = data / f"dict.{lang}.txt"
        path.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:10]), encoding="utf-8")
    base = ["--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "5"]
    # before: an IndexError inside the phase
    with pytest.raises(SystemExit):
        _parse([str(data), *base])
    err = capsys.readouterr().err
    assert "error: argument data: " in err and "but " + str(data / "dict.") in err and \
        "gives only 14 ids (10 entries and 4 special symbols): it is not the dictionary the split was binarized " \
        "with; GradInit and training read it: binarize the split again with fairseq-preprocess" in err, err[-800:]
    _parse([str(tiny_data), *base])  # the intact data-bin passes


def test_a_report_input_without_config_or_with_a_history_that_is_no_list(tmp_path):
    from fairseq_gradinit.fairseq_plugin.analysis import per_layer as rep

    saved = {"scales": {"w": 0.5}, "history": [{"iteration": 1, "loss_s": 2.0, "grad_norm": 3.0}]}
    # before: compared with p=2 for lack of the optimizer, and reported as "NOT reproduced"
    check = rep.check_first_iteration(None, saved)
    assert check["done"] is False and "has no 'config'" in check["reason"]
    path = tmp_path / "gradinit.json"
    path.write_text(json.dumps({**saved, "history": "ten"}))
    # before: a TypeError traceback
    with pytest.raises(ValueError, match=f"--gradinit-json {path}: its field 'history' is str"):
        rep.read_report_input(str(path))


def test_gradinit_json_of_a_phase_with_skipped_iterations_is_strict_json(tmp_path):
    from fairseq_gradinit.fairseq_plugin.data.files import atomic_write_json

    path = tmp_path / "gradinit.json"
    history = [{"iteration": 1, "branch": "skipped", "loss_s": float("nan"), "grad_norm": math.inf},
               {"iteration": 2, "branch": "objective", "loss_s": 2.0, "grad_norm": 1.0}]
    atomic_write_json(str(path), {"scales": {"w": 0.5}, "history": history})

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    saved = json.loads(path.read_text(), parse_constant=refuse)
    assert saved["history"][0]["loss_s"] is None and saved["history"][0]["grad_norm"] is None


def test_a_second_ctrl_c_while_the_lock_is_released_at_exit_prints_no_traceback(tmp_path, monkeypatch):
    import signal

    from fairseq_gradinit.fairseq_plugin.phase import lock

    calls = []

    def release(*taken):
        calls.append(taken)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the second Ctrl-C, ~10 ms after the first

    monkeypatch.setattr(lock, "_release", release)
    monkeypatch.setitem(lock._HELD, "a", ("a.lock", 3))
    monkeypatch.setitem(lock._HELD, "b", ("b.lock", 4))
    handler = signal.getsignal(signal.SIGINT)
    # before: "Exception ignored in atexit callback release_save_dirs ... KeyboardInterrupt"
    lock._release_at_exit()
    assert not lock._HELD and len(calls) == 2
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_data_path_that_does_not_exist_is_one_line_when_the_task_is_set_up(tmp_path):
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.errors import GradInitStop

    missing = tmp_path / "nope"
    cfg = convert_namespace_to_omegaconf(_parse([str(missing), "--task", "translation_gradinit", *TINY_MODEL,
                                                 "--lr", "1e-3", "--gradinit-iters", "5"]))
    # before: a 20-line FileNotFoundError traceback from the task's setup, after the plugin had loaded
    with pytest.raises(GradInitStop, match=f"gradinit: error: argument data: {missing} does not exist; give the "
                                           "data-bin folder that fairseq-preprocess wrote"):
        tasks.setup_task(cfg.task)


def test_a_validation_split_of_which_fairseq_makes_no_batch_is_refused_before_the_phase(tmp_path, caplog):
    """A language-modeling validation split of fewer blocks than --required-batch-size-multiple (8): fairseq drops
    that last batch, so validation has no batch at all. Refused before the phase, naming the split (before: the phase
    ran, then fairseq's "The dataset is empty" at the first validation); batches fairseq keeps pass."""
    import re

    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan
    from fairseq_gradinit.fairseq_plugin.settings.validation import valid_split_error
    from fairseq_helpers import make_tiny_lm_bin
    from fairseq_train import NO_BATCH_THREAD, TINY_LM, train_inprocess

    data = make_tiny_lm_bin(tmp_path, {"train": 60, "valid": 2}, 300)
    argv = [str(data), "--arch", "transformer_lm", *TINY_LM, "--max-update", "1", *NO_BATCH_THREAD,
            "--gradinit-iters", "2"]
    caplog.set_level("INFO")
    with pytest.raises(SystemExit) as exc:
        train_inprocess(argv + ["--save-dir", str(tmp_path / "a")])
    message = str(exc.value.code)
    assert re.fullmatch(r"gradinit: error: validation split 'valid': its (\d) samples make no batch: fairseq drops a "
                        r"last batch of fewer than --required-batch-size-multiple 8 samples; fairseq-train would stop "
                        r"at its first validation, after the GradInit phase \('The dataset is empty'\)\. Pass "
                        r"--required-batch-size-multiple 1 \(any value up to \1 keeps them\), use a larger validation split, or "
                        r"pass --disable-validation", message), message
    assert "gradinit iter" not in caplog.text and not (tmp_path / "a" / "gradinit.json").exists()
    ns = _parse(argv + ["--save-dir", str(tmp_path / "b"), "--required-batch-size-multiple", "1"])
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    assert valid_split_error(task, task.build_model(cfg.model, from_checkpoint=True), build_plan(ns)) is None
    # fairseq validates only from --validate-after-updates on: beyond --max-update it never does, and the split
    # that makes no batch is no reason to refuse the run; up to --max-update it is
    for after, refused in (("2", False), ("1", True)):
        ns = _parse(argv + ["--save-dir", str(tmp_path / f"c{after}"), "--validate-after-updates", after])
        cfg = convert_namespace_to_omegaconf(ns)
        task = tasks.setup_task(cfg.task)
        error = valid_split_error(task, task.build_model(cfg.model, from_checkpoint=True), build_plan(ns))
        assert (error is not None) == refused, (after, error)


def test_a_save_dir_fairseq_train_cannot_write_into_is_refused_when_parsed(tmp_path, capsys, monkeypatch):
    """An existing --save-dir that fairseq-train's own first check cannot write into (its probe file 'dummy' a
    folder there; a read-only file system, as os.access and statvfs report it) is refused when parsed, in one line
    (before: accepted, then fairseq's OSError traceback before any work). Folder permissions, which do not stop root,
    are the next test's."""
    import os

    from fairseq import checkpoint_utils

    from fairseq_gradinit.files.paths import unwritable_folder_reason

    base = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "5"]
    save = tmp_path / "ck"
    (save / "dummy").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):  # what fairseq-train meets first thing
        checkpoint_utils.verify_checkpoint_directory(str(save))
    capsys.readouterr()  # fairseq logs that failure itself (through whatever handler an earlier test left): not ours
    with pytest.raises(SystemExit) as exc:
        _parse(base + ["--save-dir", str(save)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert (f"error: argument --save-dir: {save / 'dummy'} is a folder; fairseq-train checks that it can write the "
            "save folder by writing that file before any work") in err, err[-600:]
    (save / "dummy").rmdir()
    _parse(base + ["--save-dir", str(save)])

    class ReadOnly:
        f_flag = os.ST_RDONLY

    # a read-only file system (which stops root too), as the kernel answers for that folder
    access = os.access
    monkeypatch.setattr("os.access", lambda path, mode, **k: os.fspath(path) != str(save) and access(path, mode, **k))
    monkeypatch.setattr("os.statvfs", lambda path: ReadOnly)
    assert unwritable_folder_reason(save) == f"cannot be written: {save} is on a read-only file system"
    with pytest.raises(SystemExit) as exc:
        _parse(base + ["--save-dir", str(save)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and (f"error: argument --save-dir: {save} cannot be written: {save} is on a read-only "
                                    "file system, and fairseq-train writes into it before any work") in err, err


def test_a_save_dir_without_write_permission_is_refused_when_parsed(tmp_path, capsys):
    """An existing --save-dir this user may not write into: refused when parsed, in one line (before: accepted,
    then fairseq's PermissionError traceback before any work)."""
    import os

    if os.geteuid() == 0:
        pytest.skip("runs as root, whom folder permissions do not stop: fairseq-train writes into such a folder too")
    base = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "5"]
    save = tmp_path / "ck"
    save.mkdir()
    save.chmod(0o500)
    try:
        with pytest.raises(SystemExit) as exc:
            _parse(base + ["--save-dir", str(save)])
    finally:
        save.chmod(0o700)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and (f"error: argument --save-dir: {save} cannot be written: no permission to write "
                                    f"into {save}, and fairseq-train writes into it before any work") in err, err
