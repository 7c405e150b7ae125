"""Numeric arguments of the scripts are checked when parsed: one argparse error, exit status 2."""
import importlib

import pytest


def _script(name):
    return importlib.import_module(f"fairseq_gradinit.tools.{name}")


@pytest.mark.parametrize("script, parser, argv, expected", [
    ("evaluate_bleu", "build_parser", ["data", "--beam", "0"], "argument --beam: invalid value 0: expected an integer >= 1"),
    ("evaluate_bleu", "build_parser", ["data", "--batch-size", "-2"], "argument --batch-size: invalid value -2"),
    ("evaluate_bleu", "build_parser", ["data", "--max-tokens", "0"], "argument --max-tokens: invalid value 0"),
    ("valid_loss_modes", "get_args_parser", ["data", "--path", "x.pt", "--max-tokens", "0"],
     "argument --max-tokens: invalid value 0: expected an integer >= 1"),
    ("gradinit_report", "build_parser", ["--gradinit-json", "g.json", "--out", "o", "--batches", "1"],
     "argument --batches: invalid value 1: expected an integer >= 2"),
    ("prepare_corpus", "build_parser", ["c", "--src", "de", "--tgt", "en", "--out", "o", "--vocab-size", "1"],
     "argument --vocab-size: invalid value 1: expected an integer >= 2"),
    ("prepare_corpus", "build_parser", ["c", "--src", "de", "--tgt", "en", "--out", "o", "--character-coverage", "0"],
     "argument --character-coverage: invalid value 0: expected a number in (0, 1]"),
    ("prepare_corpus", "build_parser", ["c", "--src", "de", "--tgt", "en", "--out", "o", "--character-coverage",
                                        "nan"], "argument --character-coverage: invalid value nan: expected a number in (0, 1]"),
    ("prepare_corpus", "build_parser", ["c", "--src", "de", "--tgt", "en", "--out", "o", "--input-sentence-size", "0"],
     "argument --input-sentence-size: invalid value 0: expected an integer >= 1"),
    ("prepare_corpus", "build_parser", ["c", "--src", "de", "--tgt", "en", "--out", "o", "--workers", "x"],
     "argument --workers: invalid value 'x': expected an integer >= 1"),
])
def test_bad_numbers_are_argument_errors(script, parser, argv, expected, capsys):
    pytest.importorskip("fairseq")
    with pytest.raises(SystemExit) as exc:
        getattr(_script(script), parser)().parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"error: {expected}" in err, err
