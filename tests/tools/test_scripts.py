"""Tests of the data/evaluation scripts in scripts/ (CPU only, no network).

The parsing/scoring tests use small synthetic text. The prepare_corpus.py end-to-end test runs
SentencePiece and fairseq-preprocess on a slice of the repository's Debian UI corpus
(data/debian-ui-de-en.tar.xz).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_helpers import small_corpus

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts"


from fairseq_gradinit.tools import evaluate_bleu, plot_curves, prepare_corpus  # noqa: E402


# --------------------------------------------------------------------------------------------
# evaluate_bleu.py
# --------------------------------------------------------------------------------------------

GENERATE_OUTPUT = """\
2024-05-01 10:00:00 | INFO | fairseq_cli.generate | {'_name': None, 'common': {...}}
2024-05-01 10:00:01 | INFO | fairseq.tasks.translation | [de] dictionary: 6008 types
S-1\tder Hund schläft .
T-1\tthe dog is sleeping.
H-1\t-0.512\tthe dog is sleeping.
D-1\t-0.512\tthe dog is sleeping.
P-1\t-0.1 -0.2 -0.3 -0.4 -0.5
H-1\t-0.900\tthe dog sleeps.
S-0\tdie Katze sitzt auf der Matte
T-0\tthe cat sits on the mat
H-0\t-0.300\tthe cat sat on the mat
D-0\t-0.300\tthe cat sat on the mat
P-0\t-0.1 -0.1
S-2\tleer
T-2\tempty
H-2\t-3.000\t
D-2\t-3.000\t
P-2\t-1.0
2024-05-01 10:00:05 | INFO | fairseq_cli.generate | NOTE: hypothesis and token scores are output in base 2
2024-05-01 10:00:05 | INFO | fairseq_cli.generate | Translated 3 sentences (17 tokens) in 1.2s (2.50 sentences/s, 14.17 tokens/s)
Generate test with beam=5: BLEU4 = 40.00, 70.0/50.0/40.0/30.0 (BP=1.000, ratio=1.000, syslen=10, reflen=10)
"""


def test_parse_generate_output_collects_best_hypotheses_and_references():
    parsed = evaluate_bleu.parse_generate_output(GENERATE_OUTPUT.splitlines())
    assert parsed.hypotheses == {
        0: "the cat sat on the mat",
        1: "the dog is sleeping.",  # first (best) of the two H-1 lines
        2: "",  # empty hypothesis survives
    }
    assert parsed.references == {0: "the cat sits on the mat", 1: "the dog is sleeping.", 2: "empty"}
    assert parsed.sources[1] == "der Hund schläft ."
    assert parsed.n_translated == 3
    assert parsed.translate_seconds == pytest.approx(1.2)
    assert parsed.subset == "test" and parsed.beam == 5
    assert parsed.fairseq_bleu.startswith("BLEU4 = 40.00")


def test_pair_up_sorts_by_id_and_checks_consistency():
    parsed = evaluate_bleu.parse_generate_output(GENERATE_OUTPUT.splitlines())
    ids, hyps, refs = evaluate_bleu.pair_up(parsed)
    assert ids == [0, 1, 2]
    assert hyps[0] == "the cat sat on the mat" and refs[2] == "empty"

    ids, hyps, refs = evaluate_bleu.pair_up(parsed, ["r0", "r1", "r2", "r3"])
    assert refs == ["r0", "r1", "r2"]
    with pytest.raises(evaluate_bleu.EvaluationError):
        evaluate_bleu.pair_up(parsed, ["r0", "r1"])  # reference file too short

    no_refs = evaluate_bleu.parse_generate_output(["H-0\t-1.0\thello"])
    with pytest.raises(evaluate_bleu.EvaluationError, match="T-<id>"):
        evaluate_bleu.pair_up(no_refs)
    with pytest.raises(evaluate_bleu.EvaluationError, match="no H-<id>"):
        evaluate_bleu.pair_up(evaluate_bleu.parse_generate_output(["some log line"]))


def test_score_bleu_matches_sacrebleu_and_reports_signature():
    import sacrebleu

    hyps = ["the cat sat on the mat", "the dog is sleeping."]
    refs = ["the cat sits on the mat", "the dog is sleeping."]
    result = evaluate_bleu.score_bleu(hyps, refs)
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert result["bleu"] == pytest.approx(expected, abs=1e-3)
    assert "tok:13a" in result["signature"] and "nrefs:1" in result["signature"]
    assert evaluate_bleu.score_bleu(refs, refs)["bleu"] == pytest.approx(100.0)
    lower = evaluate_bleu.score_bleu(["THE CAT SAT ON THE MAT"], ["the cat sat on the mat"],
                                    lowercase=True)
    assert lower["bleu"] == pytest.approx(100.0) and "case:lc" in lower["signature"]


def test_evaluate_bleu_main_from_saved_output(tmp_path, capsys):
    out_file = tmp_path / "generate-test.txt"
    out_file.write_text(GENERATE_OUTPUT, encoding="utf-8")
    json_path = tmp_path / "bleu.json"
    rc = evaluate_bleu.main([str(tmp_path), "--from-output", str(out_file),
                             "--output-json", str(json_path)])
    assert rc == 0
    result = json.loads(json_path.read_text(encoding="utf-8"))
    assert result["n_sentences"] == 3
    assert result["subset"] == "test" and result["beam"] == 5
    assert 0.0 < result["bleu"] < 100.0
    assert result["signature"].startswith("nrefs:1")
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith(f"BLEU {result['bleu']:.2f} | test | beam 5 | 3 sents")


def test_the_metric_table_scores_bleu_and_chrf_with_their_signatures():
    """Each row of the table gives the score under its name and ``score``, and sacreBLEU's signature of that metric."""
    from sacrebleu.metrics import BLEU, CHRF

    from fairseq_gradinit.tools import bleu_score

    hyps = ["the cat sat on the mat", "the dog is sleeping."]
    refs = ["the cat sits on the mat", "the dog is sleeping."]
    assert sorted(bleu_score.METRICS) == ["bleu", "chrf"]
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        result = bleu_score.score(hyps, refs, name)
        expected = metric.corpus_score(hyps, [refs])
        assert result[name] == result["score"] == round(expected.score, 4) and result["metric"] == name
        assert result["signature"] == str(metric.get_signature()) and result[f"{name}_string"] == str(expected)
    assert "nc:6" in bleu_score.score(hyps, refs, "chrf")["signature"]
    assert bleu_score.score(hyps, refs, "chrf")["chrf"] != bleu_score.score(hyps, refs, "bleu")["bleu"]
    assert bleu_score.scoring_problem("13a", False, "chrf").startswith("argument --tokenize: --metric chrf takes no")
    assert bleu_score.scoring_problem(None, True, "chrf") is None


def test_evaluate_bleu_main_scores_chrf(tmp_path, capsys):
    """--metric chrf, end to end from a saved output: the result holds chrF, its signature and no BLEU, and the
    summary names it; a word tokenizer with chrF is one argument error."""
    from sacrebleu.metrics import CHRF

    out_file = tmp_path / "generate-test.txt"
    out_file.write_text(GENERATE_OUTPUT, encoding="utf-8")
    json_path = tmp_path / "chrf.json"
    assert evaluate_bleu.main([str(tmp_path), "--from-output", str(out_file), "--metric", "chrf",
                               "--output-json", str(json_path)]) == 0
    result = json.loads(json_path.read_text(encoding="utf-8"))
    parsed = evaluate_bleu.parse_generate_output(GENERATE_OUTPUT.splitlines())
    _, hyps, refs = evaluate_bleu.pair_up(parsed)
    expected = CHRF()
    assert result["chrf"] == result["score"] == round(expected.corpus_score(hyps, [refs]).score, 4)
    assert result["metric"] == "chrf" and result["bleu"] is None and result["distinct_hypotheses"] == 3
    assert result["signature"] == str(expected.get_signature()) and result["n_sentences"] == 3
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"chrF2 {result['chrf']:.2f} | test | beam 5")
    with pytest.raises(SystemExit) as exc:
        evaluate_bleu.main([str(tmp_path), "--from-output", str(out_file), "--metric", "chrf", "--tokenize", "13a",
                            "--output-json", str(tmp_path / "no.json")])
    assert exc.value.code == 2 and "--metric chrf takes no tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "no.json").exists()


def test_the_decode_is_a_config_object_with_no_hidden_option(capsys):
    """The decode is described by a DecodeConfig (no command line handed on); the command it records is the same
    decode as a command, and gradinit-evaluate-bleu has no hidden --generate-module any more."""
    from fairseq_gradinit.tools.bleu_decode import GENERATE_MODULE, DecodeConfig

    config = DecodeConfig.for_device(True, data=Path("data"), path=Path("ck.pt"), fp16=True,
                                     fairseq_options=["--lenpen", "0.6"])
    assert (config.max_tokens, config.batch_size) == (evaluate_bleu.GPU_MAX_TOKENS, evaluate_bleu.GPU_BATCH_SIZE)
    assert config.command() == [sys.executable, "-m", GENERATE_MODULE, *config.fairseq_args()]
    assert config.fairseq_args()[-2:] == ["--lenpen", "0.6"] and "--fp16" in config.fairseq_args()
    assert config.batches()["batch_size"] == evaluate_bleu.GPU_BATCH_SIZE
    with pytest.raises(SystemExit):
        evaluate_bleu.build_parser().parse_args(["data", "--generate-module", "fairseq_cli.generate"])
    assert "unrecognized arguments: --generate-module" in capsys.readouterr().err


def test_build_generate_command_and_passthrough(tmp_path):
    own, extra = evaluate_bleu.split_passthrough(
        ["data", "--path", "ck.pt", "--cpu", "--", "--lenpen", "0.6", "--nbest", "1"])
    assert extra == ["--lenpen", "0.6", "--nbest", "1"]
    args = evaluate_bleu.build_parser().parse_args(own + ["--batch-size", "32", "--user-dir", "gradinit"])
    cmd = evaluate_bleu.decode_config(args, extra).command()
    assert cmd[:4] == [sys.executable, "-m", "fairseq_gradinit.tools.host_generate", "data"]
    assert cmd[cmd.index("--num-workers") + 1] == "0"  # no data-loader process to outlive a stop
    joined = " ".join(cmd)
    for piece in ("--path ck.pt", "--gen-subset test", "--beam 5", "--remove-bpe sentencepiece",
                  "--batch-size 32", "--cpu", "--lenpen 0.6"):
        assert piece in joined
    assert "--max-tokens" not in cmd  # only batch size was requested
    assert cmd[cmd.index("--required-batch-size-multiple") + 1] == "1"
    assert cmd[cmd.index("--user-dir") + 1] == str(REPO_ROOT / "fairseq_gradinit")
    default = evaluate_bleu.decode_config(
        evaluate_bleu.build_parser().parse_args(["data", "--path", "ck.pt"]), [], cuda=False).command()
    assert default[default.index("--max-tokens") + 1] == "4096"
    custom = evaluate_bleu.decode_config(
        evaluate_bleu.build_parser().parse_args(["data", "--path", "ck.pt"]),
        ["--required-batch-size-multiple", "8"]).command()
    assert custom.count("--required-batch-size-multiple") == 1 and custom[-1] == "8"
    workers = evaluate_bleu.decode_config(
        evaluate_bleu.build_parser().parse_args(["data", "--path", "ck.pt"]), ["--num-workers", "2"])
    assert workers.command().count("--num-workers") == 1 and workers.batches()["num_workers"] == 2


def test_subset_size_reads_mmap_index_header(tmp_path):
    import struct

    import subprocess_bleu  # the former BLEU step's reader (benchmarks/ is on pytest's pythonpath)

    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + b"\x04" + struct.pack("<Q", 1500)
    for lang in ("de", "en"):
        (tmp_path / f"test.de-en.{lang}.idx").write_bytes(header + b"\x00" * 16)
    assert subprocess_bleu.subset_size(tmp_path, "test") == 1500
    assert subprocess_bleu.subset_size(tmp_path, "valid") is None


# --------------------------------------------------------------------------------------------
# plot_curves.py
# --------------------------------------------------------------------------------------------

SIMPLE_LOG = """\
2024-05-01 10:00:00 | INFO | fairseq_cli.train | task: TranslationTask
2024-05-01 10:01:00 | INFO | train_inner | epoch 001:    100 / 350 loss=9.912, nll_loss=9.801, ppl=892.1, num_updates=100
2024-05-01 10:01:10 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.84 | nll_loss 9.65 | ppl 803.2 | wps 5012 | wpb 2901 | bsz 110 | num_updates 100
2024-05-01 10:01:11 | INFO | valid | epoch 001 | valid on 'test' subset | loss 9.99 | nll_loss 9.70 | ppl 830.1 | num_updates 100
2024-05-01 10:02:10 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.5 | nll_loss 7.1 | ppl 137.2 | wps 5100 | wpb 2901 | bsz 110 | num_updates 200 | best_loss 7.5
2024-05-01 10:02:11 | INFO | train | epoch 002 | loss 8.1 | nll_loss 7.9 | num_updates 200
2024-05-01 10:03:10 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 6.25 | nll_loss 5.9 | ppl 59.7 | num_updates 300 | best_loss 6.25
"""

JSON_LOG = """\
2024-05-01 10:01:00 | INFO | train_inner | {"epoch": 1, "update": 0.286, "loss": "9.9", "num_updates": "100"}
2024-05-01 10:01:10 | INFO | valid | {"epoch": 1, "valid_loss": "9.5", "valid_nll_loss": "9.3", "valid_ppl": "630", "valid_num_updates": "100"}
2024-05-01 10:02:10 | INFO | valid | {"epoch": 2, "valid_loss": "7", "valid_nll_loss": "6.8", "valid_num_updates": "250", "valid_best_loss": "7"}
2024-05-01 10:02:11 | INFO | train | {"epoch": 2, "train_loss": "8", "train_num_updates": "250"}
"""


def test_parse_simple_log_only_takes_the_requested_subset():
    curve = plot_curves.parse_log(SIMPLE_LOG.splitlines())
    assert curve == {100: 9.84, 200: 7.5, 300: 6.25}
    assert plot_curves.parse_log(SIMPLE_LOG.splitlines(), metric="nll_loss")[200] == 7.1
    assert plot_curves.parse_log(SIMPLE_LOG.splitlines(), subset="test") == {100: 9.99}


def test_parse_json_log_and_resumed_runs():
    assert plot_curves.parse_log(JSON_LOG.splitlines()) == {100: 9.5, 250: 7.0}
    resumed = SIMPLE_LOG + SIMPLE_LOG.replace("loss 6.25", "loss 6.0")
    assert plot_curves.parse_log(resumed.splitlines())[300] == 6.0  # later entry wins


def test_markdown_table_has_union_of_updates_and_summary_rows():
    table = plot_curves.markdown_table({"a": {100: 9.84, 200: 7.5}, "b": {100: 9.5, 250: 7.0}})
    lines = table.strip().splitlines()
    assert lines[2] == "| updates | a | b |"
    assert "| 100 | 9.840 | 9.500 |" in lines
    assert "| 200 | 7.500 | – |" in lines
    assert "| 250 | – | 7.000 |" in lines
    assert lines[-2] == "| **best** | 7.500 @ 200 | 7.000 @ 250 |"


def test_plot_curves_main_writes_json_and_markdown(tmp_path, capsys):
    (tmp_path / "a.log").write_text(SIMPLE_LOG, encoding="utf-8")
    (tmp_path / "b.log").write_text(JSON_LOG, encoding="utf-8")
    prefix = tmp_path / "out" / "curves"
    rc = plot_curves.main(["--run", f"base={tmp_path / 'a.log'}",
                           "--run", f"gradinit={tmp_path / 'b.log'}", "--out", str(prefix)])
    assert rc == 0
    data = json.loads(prefix.with_suffix(".json").read_text(encoding="utf-8"))
    assert data["runs"]["base"]["curve"] == {"100": 9.84, "200": 7.5, "300": 6.25}
    assert data["runs"]["gradinit"]["curve"]["250"] == 7.0
    assert "| updates | base | gradinit |" in prefix.with_suffix(".md").read_text(encoding="utf-8")
    captured = capsys.readouterr()
    try:
        import matplotlib  # noqa: F401
        assert prefix.with_suffix(".png").is_file()
    except ImportError:
        assert "matplotlib is not installed" in captured.err
        assert not prefix.with_suffix(".png").exists()
    with pytest.raises(SystemExit):
        plot_curves.main(["--run", "no-equals-sign"])


def test_plot_curves_adds_a_training_monitor(tmp_path, capsys):
    (tmp_path / "a.log").write_text(SIMPLE_LOG, encoding="utf-8")
    records = [{"type": "start", "update": 0, "time": 1, "version": "0.5.0"},
               {"type": "interval", "update": 100, "loss_scale": 64.0, "overflows": 0,
                "summary": {"max_ln_gain_eval": 1.2, "max_update_ratio": 0.01}},
               {"type": "overflow", "update": 150},
               {"type": "interval", "update": 200, "loss_scale": 32.0, "overflows": 1,
                "summary": {"max_ln_gain_eval": "inf", "max_update_ratio": 0.9}}]
    (tmp_path / "monitor.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    prefix = tmp_path / "out" / "curves"
    assert plot_curves.main(["--run", f"gi={tmp_path / 'a.log'}", "--monitor", f"gi={tmp_path / 'monitor.jsonl'}",
                             "--out", str(prefix)]) == 0
    run = json.loads(prefix.with_suffix(".json").read_text(encoding="utf-8"))["runs"]["gi"]
    assert run["curve"]["100"] == 9.84
    assert run["monitor"]["monitor_loss_scale"] == {"100": 64.0, "200": 32.0}
    assert run["monitor"]["monitor_max_ln_gain_eval"] == {"100": 1.2, "200": "inf"}
    assert run["monitor"]["monitor_overflows"] == {"100": 0.0, "200": 1.0}
    try:
        import matplotlib  # noqa: F401
        assert prefix.with_suffix(".png").stat().st_size > 1000
    except ImportError:
        pass
    assert plot_curves.main(["--run", f"gi={tmp_path / 'a.log'}", "--monitor", f"other={tmp_path / 'monitor.jsonl'}",
                             "--out", str(prefix)]) == 2
    assert "--monitor other: no --run with that label" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# prepare_iwslt14.sh / prepare_corpus.py
# --------------------------------------------------------------------------------------------


def test_prepare_iwslt14_script_syntax():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not available")
    proc = subprocess.run([bash, "-n", str(SCRIPTS / "prepare_iwslt14.sh")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_prepare_corpus_reports_missing_files(tmp_path):
    (tmp_path / "train.de").write_text("a\n", encoding="utf-8")
    with pytest.raises(prepare_corpus.PrepareError) as exc:
        prepare_corpus.check_inputs(tmp_path, "de", "en")
    message = str(exc.value)
    assert "train.en" in message and "valid.de" in message and "test.en" in message
    assert prepare_corpus.main([str(tmp_path), "--src", "de", "--tgt", "en",
                                "--out", str(tmp_path / "out")]) == 1


def test_prepare_corpus_end_to_end(tmp_path):
    corpus = small_corpus(tmp_path, (("train", 600), ("valid", 300), ("test", 300)))
    out = tmp_path / "prepared"
    rc = prepare_corpus.main([str(corpus), "--src", "de", "--tgt", "en", "--vocab-size", "200",
                              "--max-train-lines", "300", "--workers", "1", "--out", str(out)])
    assert rc == 0
    bin_dir = out / "bin"
    for name in ("dict.de.txt", "dict.en.txt", "spm.model"):
        assert (bin_dir / name).is_file(), name
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            for ext in ("bin", "idx"):
                assert (bin_dir / f"{split}.de-en.{lang}.{ext}").stat().st_size > 0
    # joined dictionary (the default): identical source and target dictionaries
    assert (bin_dir / "dict.de.txt").read_text() == (bin_dir / "dict.en.txt").read_text()
    summary = json.loads((out / "prepare_corpus.json").read_text(encoding="utf-8"))
    assert summary["dictionaries"] == "joint" and summary["spm_threads"] == 2  # fixed, not the machine's
    assert summary["fairseq_dict_sizes"]["de"] == summary["fairseq_dict_sizes"]["en"] == summary["fairseq_dict_size"]
    assert summary["lines"] == {"train": 300, "valid": 300, "test": 300}
    assert len((out / "spm" / "train.de").read_text(encoding="utf-8").splitlines()) == 300
    # the encoded text round-trips through the SentencePiece model
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(bin_dir / "spm.model"))
    assert sp.get_piece_size() == 200
    first_pieces = (out / "spm" / "valid.en").read_text(encoding="utf-8").splitlines()[0].split(" ")
    original = (corpus / "valid.en").read_text(encoding="utf-8").splitlines()[0]
    assert first_pieces == sp.encode(original, out_type=str)
    assert sp.decode_pieces(first_pieces) == sp.decode(sp.encode(original))
    # a second run into the same output refuses to overwrite
    assert prepare_corpus.main([str(corpus), "--src", "de", "--tgt", "en", "--vocab-size", "200",
                                "--out", str(out)]) == 1


def _dict_pieces(path: Path) -> list:
    """The symbols of a fairseq dict file, without its madeupwordNNNN padding (count 0)."""
    entries = [line.rsplit(" ", 1) for line in path.read_text(encoding="utf-8").splitlines()]
    return [sym for sym, count in entries if int(count) > 0]


def test_prepare_corpus_separate_dicts_train_with_tied_decoder_embeddings(tmp_path):
    """--separate-dicts: one joint SentencePiece model, one fairseq dictionary per side (each holding
    exactly the pieces of its own encoded training text), and fairseq-train with
    --share-decoder-input-output-embed runs on it while --share-all-embeddings is refused."""
    corpus = small_corpus(tmp_path)
    out = tmp_path / "prepared"
    argv = [str(corpus), "--src", "de", "--tgt", "en", "--vocab-size", "200", "--workers", "1",
            "--quiet", "--out", str(out)]
    args = prepare_corpus.build_parser().parse_args(argv + ["--separate-dicts"])
    assert "--joined-dictionary" not in prepare_corpus.preprocess_arguments(args, out / "spm", out / "bin")
    default_args = prepare_corpus.build_parser().parse_args(argv)
    assert "--joined-dictionary" in prepare_corpus.preprocess_arguments(default_args, out / "spm", out / "bin")
    assert prepare_corpus.main(argv + ["--separate-dicts"]) == 0

    bin_dir = out / "bin"
    summary = json.loads((out / "prepare_corpus.json").read_text(encoding="utf-8"))
    assert summary["dictionaries"] == "separate"
    import sentencepiece as spm

    vocab = {spm.SentencePieceProcessor(model_file=str(bin_dir / "spm.model")).id_to_piece(i) for i in range(200)}
    sizes = {}
    for lang in ("de", "en"):
        pieces = _dict_pieces(bin_dir / f"dict.{lang}.txt")
        seen = {p for line in (out / "spm" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
                for p in line.split()}
        assert set(pieces) == seen and set(pieces) <= vocab  # own side only, all from the joint model
        sizes[lang] = len((bin_dir / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines()) + 4
        assert sizes[lang] % 8 == 0 and sizes[lang] - 8 < len(pieces) + 4 <= sizes[lang]  # fairseq pads to 8
    assert set(_dict_pieces(bin_dir / "dict.de.txt")) != set(_dict_pieces(bin_dir / "dict.en.txt"))
    assert summary["fairseq_dict_sizes"] == sizes

    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    save = tmp_path / "ck"
    train_argv = [
        str(bin_dir), "--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-decoder-input-output-embed", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300",
        "--max-update", "2", "--cpu", "--num-workers", "0", "--no-progress-bar", "--disable-validation",
        "--no-epoch-checkpoints", "--save-dir", str(save), "--seed", "1",
    ]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), train_argv))
    distributed_utils.call_main(cfg, train.main)
    import torch

    # our own checkpoint: a pickle that torch >= 2.6 loads only with weights_only=False
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    weights = state["model"]
    assert weights["encoder.embed_tokens.weight"].shape == (sizes["de"], 16)
    assert weights["decoder.embed_tokens.weight"].shape == (sizes["en"], 16)
    assert torch.equal(weights["decoder.output_projection.weight"], weights["decoder.embed_tokens.weight"])
    assert state["optimizer_history"][-1]["num_updates"] == 2

    shared_all = [a if a != "--share-decoder-input-output-embed" else "--share-all-embeddings" for a in train_argv]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), shared_all))
    with pytest.raises(ValueError, match="joined dictionary"):
        distributed_utils.call_main(cfg, train.main)
