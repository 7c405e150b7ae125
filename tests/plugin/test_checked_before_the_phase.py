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
    same folder when the phase starts: one line, before any iteration."""
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
    assert message.startswith(f"gradinit: error: --save-dir {file / 'ck'}: cannot create or write it (")
    assert "give a writable folder" in message


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
    with pytest.raises(SystemExit) as exc:
        train_inprocess(argv)
    message = str(exc.value.code)
    assert message.startswith("gradinit: error: --gradinit-tied-embeddings per-use: this model ties "
                              "encoder.sentence_encoder.embed_tokens.weight = encoder.lm_head.weight (one tensor), "
                              "which gets no per-use scales"), message
    assert message.endswith("use --gradinit-tied-embeddings shared")
    assert not (tmp_path / "ck" / "gradinit.json").exists()


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
