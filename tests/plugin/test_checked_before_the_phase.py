"""Training settings that fairseq trips over only after the GradInit phase (optimizer, the save
folder, the train split, validation samples) are refused before the phase, most when parsed."""
import pytest

pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402

from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


def _parse(argv):
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


@pytest.mark.parametrize("extra, expected", [
    (["--adam-betas", "(0.9, 1.5)"], "argument --adam-betas: expected two numbers in [0, 1), like '(0.9, 0.98)' "
                                     "(--optimizer adam)"),
    (["--optimizer", "radam", "--adam-betas", "0.9"], "argument --adam-betas: expected a pair like '(0.9, 0.98)' "
                                                      "(--optimizer radam)"),
    (["--adam-eps", "-1"], "argument --adam-eps: invalid value -1.0: expected a number >= 0"),
    (["--save-dir", "{file}"], "argument --save-dir: {file} is a file, not a folder; GradInit's result and the "
                                       "checkpoints go there: give a folder you can write"),
    (["--save-dir", "{file}/ck"], "argument --save-dir: {file}/ck is below the file {file}, not a folder"),
    (["--train-subset", "nosuch"], "argument data: {data} has no 'nosuch' split (no file nosuch.* in it or its "
                                   "subfolders)"),
])
def test_settings_that_fail_after_the_phase_are_refused_when_parsed(tiny_data, tmp_path, capsys, extra, expected):
    file = tmp_path / "a-file"
    file.write_text("")
    fill = {"file": str(file), "data": str(tiny_data)}
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
            "--save-dir", str(tmp_path / "ck")] + [e.format(**fill) for e in extra]
    with pytest.raises(SystemExit) as exc:
        _parse(argv + ["--gradinit-iters", "780"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"error: {expected.format(**fill)}" in err, err[-800:]
    assert err.count("error:") == 1 and "Traceback" not in err
    _parse(argv)  # GradInit off: fairseq's business, as before


def test_machine_dependent_settings_are_left_to_the_machine_that_runs_them(tiny_data):
    """--fp16 on a machine without CUDA and a --save-dir elsewhere: the same command line is parsed by
    study plans and the per-layer report on other machines, so these are not refused when parsed."""
    _parse([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--fp16",
            "--save-dir", "/nonexistent-root-folder/ck", "--gradinit-iters", "780"])


def test_a_save_dir_that_cannot_be_created_stops_before_the_phase(tiny_data, tmp_path):
    """A config that was not parsed from a command line (the study's GradInit phase, Python) meets the
    same folder before the phase: one line, before any iteration."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.data.training import build_from_config

    file = tmp_path / "a-file"
    file.write_text("")
    ns = _parse([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
                 "--gradinit-iters", "2", "--save-dir", str(tmp_path / "ck")])
    cfg = convert_namespace_to_omegaconf(ns)
    cfg.checkpoint.save_dir = cfg.task.gradinit_save_dir = str(file / "ck")
    with pytest.raises(SystemExit) as exc:
        build_from_config(cfg)
    message = str(exc.value.code)
    # a file in the way: the words of the command line's refusal, found by the task's checks of the setup
    assert message == (f"gradinit: error: argument --save-dir: {file / 'ck'} is below the file {file}, not a "
                       "folder; GradInit's result and the checkpoints go there: give a folder you can write")
    # a folder the machine refuses to create (permissions; /proc refuses even root): met when the phase starts
    cfg.checkpoint.save_dir = cfg.task.gradinit_save_dir = "/proc/gradinit-test/ck"
    with pytest.raises(SystemExit) as exc:
        build_from_config(cfg)
    message = str(exc.value.code)
    assert message.startswith("gradinit: error: --save-dir /proc/gradinit-test/ck: cannot create or write it (")
    assert "give a writable folder" in message and "\n" not in message


def test_an_over_long_validation_sample_is_refused_before_the_phase(tmp_path, caplog):
    """--sample-break-mode complete_doc keeps a long document whole: fairseq refuses it at its first
    validation, which used to come after GradInit; now before it (and skipped with fairseq's flag)."""
    from fairseq import options as fairseq_options
    from fairseq_cli import preprocess

    words = [f"w{i}" for i in range(40)]
    (tmp_path / "train.txt").write_text("\n".join(" ".join(words[i:i + 6]) for i in range(0, 34)) + "\n")
    # documents separated by empty lines, the first one longer than --tokens-per-sample
    (tmp_path / "valid.txt").write_text(" ".join(words) + "\n\n" + "".join(" ".join(words[i:i + 5]) + "\n\n"
                                                                       for i in range(0, 30, 3)))
    preprocess.main(fairseq_options.get_preprocessing_parser().parse_args([
        "--only-source", "--trainpref", str(tmp_path / "train.txt"), "--validpref", str(tmp_path / "valid.txt"),
        "--destdir", str(tmp_path / "bin"), "--workers", "1"]))
    argv = [str(tmp_path / "bin"), "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1",
            "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
            "--tokens-per-sample", "32", "--sample-break-mode", "complete_doc", "--criterion", "cross_entropy",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "64", "--cpu", "--num-workers", "0",
            "--max-update", "1", "--no-progress-bar", "--gradinit-iters", "1000"]
    with pytest.raises(SystemExit) as exc:
        train_inprocess(argv + ["--save-dir", str(tmp_path / "a")])
    message = str(exc.value.code)
    assert message.startswith("gradinit: error: validation split 'valid': Size of sample #0 is invalid (=41) since "
                              "max_positions=32, skip this example with --skip-invalid-size-inputs-valid-test"), message
    assert "gradinit iter" not in caplog.text and not (tmp_path / "a" / "gradinit.json").exists()
    caplog.set_level("INFO")
    train_inprocess(argv[:-1] + ["2", "--save-dir", str(tmp_path / "b"), "--skip-invalid-size-inputs-valid-test"])
    assert (tmp_path / "b" / "gradinit.json").exists() and (tmp_path / "b" / "checkpoint_last.pt").exists()


def test_a_negative_wskip_profile_seed_is_refused_when_parsed(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                "--arch", "transformer_wskip_iwslt_de_en", "--wskip-init", "admin", "--wskip-profile-seed", "-5"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: argument --wskip-profile-seed: invalid value -5: expected an integer >= 0" \
        in err, err[-600:]


def _refused_before_the_phase(argv, save) -> str:
    """fairseq-train's one-line stop for ``argv``, checked to come before GradInit wrote anything into ``save``."""
    with pytest.raises(SystemExit) as exc:
        train_inprocess(argv)
    assert not (save / "gradinit.json").exists()
    return str(exc.value.code)


def test_per_use_scales_for_ties_the_plugin_cannot_split_are_refused(tmp_path):
    """RoBERTa ties its output head to the input embedding, which has no per-use multiplier: per-use
    would have trained it shared without a word; now it is refused when the model is built."""
    from fairseq_helpers import make_tiny_lm_bin

    data = make_tiny_lm_bin(tmp_path, {"train": 60, "valid": 10}, 300)
    argv = [str(data), "--task", "masked_lm", "--arch", "roberta", "--encoder-layers", "1", "--encoder-embed-dim",
            "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--tokens-per-sample", "32",
            "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--cpu",
            "--num-workers", "0", "--max-update", "1", "--no-progress-bar", "--save-dir", str(tmp_path / "ck"),
            "--gradinit-iters", "2", "--gradinit-tied-embeddings", "per-use"]
    message = _refused_before_the_phase(argv, tmp_path / "ck")
    assert message.startswith("gradinit: error: --gradinit-tied-embeddings per-use: this model ties "
                              "encoder.sentence_encoder.embed_tokens.weight = encoder.lm_head.weight (one tensor), "
                              "which gets no per-use scales"), message
    assert message.endswith("use --gradinit-tied-embeddings shared")


def test_per_use_scales_for_a_decoder_that_reuses_its_embedding_in_its_forward_are_refused(tiny_data, tmp_path):
    """fairseq's LSTM decoder with --share-decoder-input-output-embed uses embed_tokens.weight as its output
    projection inside its forward, under one name: per-use would have trained it shared without a word."""
    argv = [str(tiny_data), "--task", "translation", "--arch", "lstm", "--encoder-embed-dim", "16",
            "--encoder-hidden-size", "16", "--decoder-embed-dim", "16", "--decoder-hidden-size", "16",
            "--decoder-out-embed-dim", "16", "--share-decoder-input-output-embed", "--optimizer", "adam", "--lr",
            "1e-3", "--max-tokens", "256", "--cpu", "--num-workers", "0", "--max-update", "1", "--no-progress-bar",
            "--save-dir", str(tmp_path / "ck"), "--gradinit-iters", "2", "--gradinit-tied-embeddings", "per-use"]
    message = _refused_before_the_phase(argv, tmp_path / "ck")
    assert message.startswith("gradinit: error: --gradinit-tied-embeddings per-use: this model ties "
                              "decoder.embed_tokens.weight = decoder.embed_tokens.weight as its output projection "
                              "(one tensor), which gets no per-use scales"), message
    # the same model with its decoder's embedding untied is accepted by the check
    from fairseq_gradinit.fairseq_plugin.features.tied import uncovered_ties
    from fairseq.models.lstm import LSTMDecoder

    import torch

    class _Model(torch.nn.Module):
        def __init__(self, share):
            super().__init__()
            from fairseq.data import Dictionary

            d = Dictionary()
            self.decoder = LSTMDecoder(d, embed_dim=8, hidden_size=8, out_embed_dim=8, num_layers=1,
                                       attention=False, share_input_output_embed=share)

    assert uncovered_ties(_Model(True)) and not uncovered_ties(_Model(False))


def test_fp16_without_cuda_stops_when_the_phase_starts(tiny_data, tmp_path, caplog):
    """fairseq-train with --fp16 on a machine without CUDA fails when it builds its optimizer, after
    GradInit: the phase refuses it first, on the machine that runs it."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    caplog.set_level("INFO")
    with pytest.raises(SystemExit) as exc:
        train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--fp16",
                         "--max-update", "1", "--save-dir", str(tmp_path / "ck"), "--gradinit-iters", "1000"])
    assert str(exc.value.code) == ("gradinit: error: --fp16: fp16 training needs a CUDA GPU and this machine has none; "
                                   "fairseq-train would fail after the GradInit phase. Drop --fp16 to train in fp32 "
                                   "here, or run on a GPU")
    assert "gradinit iter" not in caplog.text and not (tmp_path / "ck" / "gradinit.json").exists()


# -- round 5: what fairseq refuses only after the phase, found before it ------------------------------
def _plan_task_model(argv):
    """The plan, the task and a fresh model of ``argv`` (the model built as for a checkpoint: no GradInit)."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan

    ns = _parse(argv)
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    return build_plan(ns), task, task.build_model(cfg.model, from_checkpoint=True)


@pytest.mark.parametrize("flag", ["--bf16", "--memory-efficient-bf16", "--tpu"])
def test_bf16_without_torch_xla_is_refused_when_the_phase_starts(tiny_data, flag):
    """fairseq 0.12.3's parser turns --bf16 into --tpu, and its Trainer then needs torch_xla: without it,
    fairseq-train failed when it built the trainer, after the GradInit phase."""
    import importlib.util

    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan
    from fairseq_gradinit.fairseq_plugin.settings.validation import precision_error

    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("this machine has torch_xla")
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "780"]
    ns = _parse(argv + [flag])
    assert ns.tpu is True  # what fairseq's Trainer reads
    if flag == "--tpu":
        expected = "--tpu: training on a TPU needs torch_xla, and this machine has none; fairseq-train would fail " \
                   "after the GradInit phase. Drop --tpu"
    else:
        expected = (f"{flag}: fairseq 0.12.3 trains bf16 only on a TPU ({flag} turns on --tpu), which needs torch_xla, "
                    "and this machine has none; fairseq-train would fail after the GradInit phase. Drop "
                    f"{flag} (--fp16 or --amp train in mixed precision on a GPU)")
    assert precision_error(build_plan(ns)) == expected
    assert precision_error(build_plan(_parse(argv))) is None


def test_a_validation_sample_over_max_tokens_valid_is_refused_before_the_phase(tiny_data):
    """fairseq batches the validation split with --max-tokens-valid (default --max-tokens) and refuses a
    sample of more tokens at its first validation, after the phase; --skip-invalid-size-inputs-valid-test
    does not skip it. The refusal and fairseq's own agree on both sides of the longest sample."""
    from fairseq import utils

    from fairseq_gradinit.fairseq_plugin.settings.validation import valid_split_error

    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "780"]
    plan, task, model = _plan_task_model(argv)
    assert valid_split_error(task, model, plan) is None
    task.load_dataset("valid", combine=False, epoch=1)
    dataset = task.datasets["valid"]
    longest = int(max(dataset.num_tokens(i) for i in range(len(dataset))))

    def fairseq_refuses(max_tokens):
        try:
            task.get_batch_iterator(dataset, max_tokens=max_tokens, max_positions=utils.resolve_max_positions(
                task.max_positions(), model.max_positions()), ignore_invalid_inputs=True, disable_iterator_cache=True)
        except AssertionError:
            return True
        return False

    for extra in (["--max-tokens-valid", str(longest - 1)], ["--max-tokens", str(longest - 1)],
                  ["--max-tokens-valid", str(longest - 1), "--skip-invalid-size-inputs-valid-test"]):
        plan, task, model = _plan_task_model(argv + extra)
        error = valid_split_error(task, model, plan)
        assert error is not None and error.startswith("validation split 'valid': sample #"), (extra, error)
        assert f"tokens, more than --max-tokens-valid {longest - 1} (its default is --max-tokens)" in error
        assert error.endswith(f"Raise --max-tokens-valid to at least {longest}")
    assert fairseq_refuses(longest - 1)
    plan, task, model = _plan_task_model(argv + ["--max-tokens-valid", str(longest)])
    assert valid_split_error(task, model, plan) is None and not fairseq_refuses(longest)
    plan, task, model = _plan_task_model(argv + ["--max-tokens-valid", "1", "--disable-validation"])
    assert valid_split_error(task, model, plan) is None


def test_a_restore_file_of_another_architecture_is_one_line_naming_the_first_entry(tiny_data, tmp_path):
    """fairseq loads the checkpoint strictly ("Cannot load model parameters ..." traceback); the resume
    check names the first entry that does not fit, where torch's strict load also refuses."""
    import torch

    from fairseq_gradinit.fairseq_plugin.settings.validation import resume_error

    base = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3"]
    _, _, model = _plan_task_model(base)
    cases = {
        "fewer": (["--decoder-layers", "1"], "it lacks decoder.layers.1."),
        "more": (["--encoder-layers", "3"], "it holds encoder.layers.2."),
        "wider": (["--encoder-ffn-embed-dim", "48"], "encoder.layers.0.fc1.weight is [48, 32] in it and [64, 32] in "
                                                     "this model"),
    }
    for name, (extra, first) in cases.items():
        _, _, other = _plan_task_model(base + extra)
        path = tmp_path / f"{name}.pt"
        torch.save({"model": other.state_dict()}, path)
        error = resume_error(model, str(path))
        assert error is not None and error.startswith(f"cannot resume from {path}: its model state does not fit the "
                                                      f"model of this command line ({first}"), error
        assert error.endswith("Resume with the architecture options it was trained with, or move it away (or give "
                              "another --save-dir) to start anew")
        with pytest.raises(RuntimeError):  # the reference: what fairseq's strict load does with it
            model.load_state_dict(torch.load(path, weights_only=False)["model"], strict=True)
    same = tmp_path / "same.pt"
    torch.save({"model": model.state_dict()}, same)
    assert resume_error(model, str(same)) is None
    torch.save({"last_optimizer_state": {}}, tmp_path / "no-model.pt")
    assert resume_error(model, str(tmp_path / "no-model.pt")).startswith(
        f"cannot resume from {tmp_path / 'no-model.pt'}: it holds no model state")


@pytest.mark.parametrize("name, extra", [
    ("checkpoint_last.pt", []),
    ("checkpoint_best.pt", []),
    ("checkpoint_last-x.pt", ["--checkpoint-suffix=-x"]),
    ("checkpoint_best-x.pt", ["--checkpoint-suffix=-x"]),
])
def test_a_checkpoint_path_that_is_a_folder_is_refused_when_parsed(tiny_data, tmp_path, capsys, name, extra):
    """fairseq takes a checkpoint_last.pt that is a folder for no checkpoint, trains, and fails at its first
    save, after the phase; refused when parsed, naming it. Without GradInit, or where fairseq writes no such
    file (--no-last-checkpoints, --disable-validation, --no-save), it is fairseq's business."""
    save = tmp_path / "ck"
    (save / name).mkdir(parents=True)
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--save-dir", str(save),
            *extra]
    with pytest.raises(SystemExit) as exc:
        _parse(argv + ["--gradinit-iters", "780"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and (
        f"error: argument --save-dir: {save / name} is a folder; fairseq-train writes its checkpoint there and would "
        "fail at its first save, after the GradInit phase: move it away, or give another --save-dir") in err, err[-600:]
    assert err.count("error:") == 1 and "Traceback" not in err
    _parse(argv)
    skip = "--no-last-checkpoints" if name.startswith("checkpoint_last") else "--disable-validation"
    for flags in ([skip], ["--no-save"]):
        _parse(argv + ["--gradinit-iters", "780", *flags])


def _damage(folder, how):
    """Damage ``folder``'s data-bin as ``how`` says; the file the refusal names, and the words it uses."""
    import shutil

    train_bin, train_idx = folder / "train.de-en.en.bin", folder / "train.de-en.en.idx"
    if how == "truncated bin":
        train_bin.write_bytes(train_bin.read_bytes()[:-10])
        return train_bin, "bytes, but train.de-en.en.idx describes"
    if how == "truncated idx":
        train_idx.write_bytes(train_idx.read_bytes()[:-8])
        return train_idx, "is damaged ("
    if how == "mismatched valid":  # another split's .bin beside the validation .idx
        shutil.copy(folder / "train.de-en.de.bin", folder / "valid.de-en.de.bin")
        return folder / "valid.de-en.de.bin", "longer than its index says, or the two files come from different"
    if how == "offsets":
        data = bytearray(train_idx.read_bytes())
        data[-1] ^= 0x10  # the last sample's offset, in the last 8 bytes
        train_idx.write_bytes(bytes(data))
        return train_idx, "the offset of sample #"
    if how == "no bin":
        train_bin.unlink()
        return train_idx, "has no train.de-en.en.bin beside it"
    raise ValueError(how)


@pytest.mark.parametrize("how", ["truncated bin", "truncated idx", "mismatched valid", "offsets", "no bin"])
def test_a_truncated_or_mismatched_data_bin_is_refused_when_parsed(tiny_data, tmp_path, capsys, how):
    """A .bin shorter than its .idx says failed only when a batch reached the missing tokens (in the phase
    or in training); a damaged .idx with a traceback when the split was loaded. Refused when parsed,
    naming the file; fairseq's own reader fails on the damaged files (the reference)."""
    import shutil

    from fairseq.data.indexed_dataset import MMapIndexedDataset

    data = tmp_path / "bin"
    shutil.copytree(tiny_data, data)
    named, words = _damage(data, how)
    argv = [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--save-dir", str(tmp_path / "ck")]
    with pytest.raises(SystemExit) as exc:
        _parse(argv + ["--gradinit-iters", "780"])
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "error:" in x)
    assert exc.value.code == 2 and f"error: argument data: {named}" in line, err[-600:]
    assert words in line and line.endswith("GradInit and training read it: binarize the split again with "
                                           "fairseq-preprocess")
    assert err.count("error:") == 1 and "Traceback" not in err
    _parse(argv)  # GradInit off: fairseq's business
    if how == "truncated bin":  # the last sample reaches past the end
        dataset = MMapIndexedDataset(str(named)[: -len(".bin")])
        with pytest.raises(ValueError):
            dataset[len(dataset) - 1]
    if how == "truncated idx":
        with pytest.raises(ValueError):
            MMapIndexedDataset.Index(str(named))


def test_an_intact_data_bin_and_splits_the_run_does_not_read_pass(tiny_data, tmp_path):
    """The test split and the validation split under --disable-validation are not read by training: a
    damaged one is left to whoever reads it."""
    import shutil

    data = tmp_path / "bin"
    shutil.copytree(tiny_data, data)
    argv = [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--save-dir",
            str(tmp_path / "ck"), "--gradinit-iters", "780"]
    _parse(argv)
    (data / "test.de-en.de.bin").write_bytes(b"")
    _parse(argv)
    (data / "valid.de-en.de.bin").write_bytes(b"")
    _parse(argv + ["--disable-validation"])


def test_fairseq_train_stops_before_the_phase_on_what_fairseq_refuses_after_it(tiny_data, tmp_path, caplog):
    """End to end: a validation sample over --max-tokens-valid and --bf16 without torch_xla end fairseq-train
    in one line before any GradInit iteration (before: after the whole phase, with a traceback)."""
    import importlib.util

    caplog.set_level("INFO")
    base = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--gradinit-iters", "1000"]
    cases = [(["--max-tokens-valid", "5"], "gradinit: error: validation split 'valid': sample #")]
    if importlib.util.find_spec("torch_xla") is None:
        cases.append((["--bf16"], "gradinit: error: --bf16: fairseq 0.12.3 trains bf16 only on a TPU"))
    for i, (extra, start) in enumerate(cases):
        with pytest.raises(SystemExit) as exc:
            train_inprocess(base + extra + ["--save-dir", str(tmp_path / str(i))])
        assert str(exc.value.code).startswith(start), exc.value.code
        assert "gradinit iter" not in caplog.text and not (tmp_path / str(i) / "gradinit.json").exists()


@pytest.mark.parametrize("case", ["adam betas", "train subset", "checkpoint folder", "truncated bin"])
def test_the_training_setup_of_a_config_not_parsed_from_a_command_line_stops_before_the_phase(
        tiny_data, tmp_path, caplog, case):
    """fairseq-hydra-train and Python callers skip the parser, where the training setup is refused above: the
    task runs the same checks on the run's plan before any GradInit iteration, in one line, with the same
    words (before: fairseq met these after the whole phase)."""
    import shutil

    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    from fairseq_gradinit.fairseq_plugin.settings.options import GLOBAL_SETTINGS, PluginOptions

    caplog.set_level("INFO")
    data, save = tmp_path / "bin", tmp_path / "ck"
    shutil.copytree(tiny_data, data)
    cfg = convert_namespace_to_omegaconf(_parse([str(data), "--task", "translation_gradinit", *TINY_MODEL,
                                                 "--lr", "1e-3", "--max-update", "1", "--save-dir", str(save),
                                                 "--gradinit-iters", "50"]))
    # As fairseq-hydra-train composes it: the task's global settings follow fairseq's fields (the conversion
    # from a namespace copies their values instead)
    for name in GLOBAL_SETTINGS:
        setattr(cfg.task, name, getattr(PluginOptions, name))
    if case == "adam betas":
        cfg.optimizer.adam_betas = "(0.9, 1.5)"
        expected = "argument --adam-betas: expected two numbers in [0, 1)"
    elif case == "train subset":
        cfg.dataset.train_subset = "nosuch"
        expected = f"argument data: {data} has no 'nosuch' split"
    elif case == "checkpoint folder":
        (save / "checkpoint_last.pt").mkdir(parents=True)
        expected = f"argument --save-dir: {save / 'checkpoint_last.pt'} is a folder"
    else:
        named, words = _damage(data, "truncated bin")
        expected = f"argument data: {named}"
    with pytest.raises(SystemExit) as exc:
        distributed_utils.call_main(cfg, train.main)
    message = str(exc.value.code)
    assert message.startswith("gradinit: error: " + expected) and "\n" not in message, message
    assert "gradinit iter" not in caplog.text and not (save / "gradinit.json").exists()
    assert not (save / "gradinit.state.pt").exists()
