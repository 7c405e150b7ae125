"""Loading a trained checkpoint computes what was trained: GradInit (or an init file) never runs when
fairseq-validate, fairseq-generate, fairseq-interactive, load_model_ensemble_and_task or the scripts
load a model trained with --gradinit-iters, even where they build the criterion."""
import json
import shutil
import sys

import pytest

pytest.importorskip("fairseq")

import torch  # noqa: E402

from fairseq_gradinit.fairseq_plugin.registration.hook import GradInitTaskMixin  # noqa: E402
from fairseq_helpers import REPO  # noqa: E402
from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """A checkpoint trained with GradInit (its config says --gradinit-iters 2), moved away from its
    --save-dir as a shared or downloaded model is, and its weights."""
    root = tmp_path_factory.mktemp("trained")
    save = root / "ck"
    train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "5e-3",
                     "--max-update", "2", "--save-dir", str(save), "--gradinit-iters", "2"])
    ckpt = (save / "checkpoint_last.pt").rename(root / "model.pt")
    shutil.rmtree(save)
    weights = torch.load(ckpt, map_location="cpu", weights_only=False)["model"]
    return ckpt, weights


@pytest.fixture
def no_gradinit(monkeypatch, tmp_path, caplog):
    """Runs in an empty working folder; fails the test if GradInit (or an init file) is applied."""
    calls = []
    real = GradInitTaskMixin.run

    def spy(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GradInitTaskMixin, "run", spy)
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    yield calls
    assert calls == []
    assert not list(tmp_path.rglob("gradinit.json")) and "gradinit iter" not in caplog.text


def _same(model, weights):
    state = model.state_dict()
    return all(torch.equal(state[k], weights[k]) for k in weights)


def test_load_model_ensemble_and_task_then_build_criterion_keeps_the_trained_weights(trained, tiny_data,
                                                                                       no_gradinit):
    from fairseq import checkpoint_utils

    ckpt, weights = trained
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)],
                                                                      arg_overrides={"data": str(tiny_data)})
    assert cfg.task.gradinit_iters == 2  # the trained run's setting travels with the checkpoint
    task.build_criterion(cfg.criterion)
    assert _same(models[0], weights)


def test_fairseq_validate_does_not_run_gradinit(trained, tiny_data, no_gradinit, caplog, capsys, monkeypatch):
    from fairseq_cli import validate

    ckpt, _ = trained
    monkeypatch.setattr(sys, "argv", ["fairseq-validate", str(tiny_data), "--path", str(ckpt), "--cpu",
                                      "--task", "translation_gradinit", "--max-tokens", "400",
                                      "--log-format", "simple", "--user-dir", str(REPO / "fairseq_gradinit")])
    validate.cli_main()
    assert "valid on 'valid' subset | loss" in caplog.text + capsys.readouterr().out


def test_fairseq_generate_and_interactive_do_not_run_gradinit(trained, tiny_data, no_gradinit, tmp_path, capsys,
                                                              monkeypatch):
    from fairseq_cli import generate, interactive

    ckpt, _ = trained
    common = [str(tiny_data), "--user-dir", str(REPO / "fairseq_gradinit"), "--path", str(ckpt), "--cpu",
              "--beam", "2", "--max-len-b", "5"]
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", *common, "--batch-size", "20", "--gen-subset", "valid"])
    generate.cli_main()
    assert capsys.readouterr().out.count("H-") == 40
    source = tmp_path / "source.de"
    source.write_text("Datei öffnen\nSpeichern\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["fairseq-interactive", *common, "--input", str(source), "-s", "de", "-t", "en"])
    interactive.cli_main()
    assert capsys.readouterr().out.count("H-") == 2


def test_valid_loss_modes_script_keeps_the_trained_weights(trained, tiny_data, no_gradinit, monkeypatch):
    from fairseq_gradinit.tools import valid_loss_modes
    ckpt, weights = trained
    seen = []
    real = valid_loss_modes.split_loss

    def spy(model, *a, **k):
        seen.append(_same(model, weights))
        return real(model, *a, **k)

    monkeypatch.setattr(valid_loss_modes, "split_loss", spy)
    res = valid_loss_modes.main([str(tiny_data), "--path", str(ckpt), "--cpu", "--max-tokens", "400"])
    assert seen == [True, True] and res["num_updates"] == 2
    json.dumps(res)


def test_valid_loss_modes_refuses_a_wrong_data_bin_or_subset(trained, tiny_data, tmp_path, capsys):
    """One 'error:' line, exit 2, naming what to pass instead (before: tracebacks)."""
    from fairseq_helpers import make_tiny_bin

    from fairseq_gradinit.tools import valid_loss_modes
    ckpt, _ = trained
    (tmp_path / "other").mkdir()
    other = make_tiny_bin(tmp_path / "other", {"train": 60, "valid": 10, "test": 10}, 200)  # another dictionary
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state["task_state"] = {}  # a checkpoint that records no dictionaries (written before they were recorded)
    unrecorded = tmp_path / "unrecorded.pt"
    torch.save(state, unrecorded)
    capsys.readouterr()
    for data, extra, expected in (
            (tiny_data, ["--subset", "tst"], f"argument --subset: {tiny_data} has no split 'tst' (it has: test, "
                                             "train, valid)"),
            (tiny_data.parent, [], f"argument data: {tiny_data.parent} holds no fairseq data-bin (no dict.*.txt); "
                                   f"its subfolder {tiny_data} is one: pass that"),
            (tmp_path / "nope", [], f"argument data: {tmp_path / 'nope'} is not a folder"),
            (other, [], f"argument data: the source dictionary of {other} is not the one the model was trained "
                        "with (200 symbols instead of 600)"),
            (other, ["--path", str(unrecorded)], f"argument data: the dictionary of {other} does not fit "
                                                 f"{unrecorded}'s embeddings (size mismatch for")):
        with pytest.raises(SystemExit) as exc:
            valid_loss_modes.main([str(data), "--path", str(ckpt), "--cpu", *extra])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"error: {expected}" in err, err[-1500:]
        assert "Traceback" not in err and err.count("error:") == 1


def _evaluate_bleu():
    from fairseq_gradinit.tools import evaluate_bleu

    return evaluate_bleu


def test_evaluate_bleu_refuses_a_plugin_checkpoint_without_user_dir_and_an_empty_split(trained, tiny_data, tmp_path,
                                                                                      capsys):
    import struct

    evaluate_bleu = _evaluate_bleu()
    ckpt, _ = trained
    empty = tmp_path / "bin"
    shutil.copytree(tiny_data, empty)
    for idx in empty.glob("test.*.idx"):  # a test split of 0 sentences (the count in the index header)
        header = bytearray(idx.read_bytes())
        header[18:26] = struct.pack("<Q", 0)
        idx.write_bytes(bytes(header))
    capsys.readouterr()
    for data, extra, expected in (
            (tiny_data, [], f"argument --path: {ckpt} was trained with the fairseq_gradinit plugin (its task is "
                            "translation_gradinit), which fairseq-generate needs to load it: add --user-dir "
                            "fairseq_gradinit"),
            (empty, ["--user-dir", "fairseq_gradinit"], f"argument --gen-subset: the split 'test' of {empty} has no "
                                                        "sentences: there is nothing to translate")):
        with pytest.raises(SystemExit) as exc:
            evaluate_bleu.main([str(data), "--path", str(ckpt), "--cpu", *extra])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"error: {expected}" in err and "Traceback" not in err, err[-1500:]


def test_a_data_bin_with_other_words_in_a_same_size_dictionary_is_refused(trained, tiny_data, tmp_path, monkeypatch,
                                                                          capsys):
    """The checkpoint records its dictionaries: generate, the Python API and a resume on a data-bin
    whose dictionary has the same size but other words stop with one line (before: nonsense)."""
    from fairseq import checkpoint_utils
    from fairseq_cli import generate

    ckpt, _ = trained
    other = tmp_path / "other-bin"
    shutil.copytree(tiny_data, other)
    for name in ("dict.de.txt", "dict.en.txt"):  # two words swap their ids
        lines = (other / name).read_text(encoding="utf-8").splitlines(keepends=True)
        lines[0], lines[1] = lines[1], lines[0]
        (other / name).write_text("".join(lines), encoding="utf-8")
    expected = (f"gradinit: error: the source dictionary of {other} is not the one the model was trained with (the "
                "same size (600 symbols) but other words): its word ids would mean other words. Use the data-bin the "
                "model was trained on")
    with pytest.raises(SystemExit) as exc:
        checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides={"data": str(other)})
    assert str(exc.value.code) == expected
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", str(other), "--user-dir", str(REPO / "fairseq_gradinit"),
                                      "--path", str(ckpt), "--cpu", "--beam", "1", "--max-len-b", "3"])
    with pytest.raises(SystemExit) as exc:
        generate.cli_main()
    assert str(exc.value.code) == expected
    capsys.readouterr()
    assert _evaluate_bleu().main([str(other), "--path", str(ckpt), "--user-dir", "fairseq_gradinit", "--cpu",
                                  "--output-json", str(tmp_path / "bleu.json")]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: fairseq-generate failed (exit 1): {expected}", err[-2000:]

    save = tmp_path / "resume"
    save.mkdir()
    shutil.copy(ckpt, save / "checkpoint_last.pt")
    argv = ["--task", "translation_gradinit", *TINY_MODEL, "--lr", "5e-3", "--max-update", "3", "--save-dir",
            str(save), "--gradinit-iters", "2"]
    with pytest.raises(SystemExit) as exc:
        train_inprocess([str(other), *argv])
    assert str(exc.value.code) == expected.replace("gradinit: error: ", f"gradinit: error: cannot resume from "
                                                                        f"{save / 'checkpoint_last.pt'}: ")
    train_inprocess([str(tiny_data), *argv])  # the data-bin it was trained on resumes
