"""A refused command-line value is an :class:`~fairseq_gradinit.core.errors.OptionValueError` carrying its
flag, what follows the flag and the reason; its text is the message the options have always given, and the
front ends word it from the attributes (argparse's ``argument --flag: ...``)."""
import argparse
import pickle

import pytest

from fairseq_gradinit.command_line.argtypes import parse_betas
from fairseq_gradinit.core.errors import OptionValueError
from fairseq_gradinit.core.options import options_of, parse_scale_bounds, values_from
from fairseq_gradinit.command_line.option_forms import add_arguments

SPECS = {s.name: s for s in options_of(python_only=False)}


@pytest.mark.parametrize("name, text, message, reason", [
    ("dropout", "maybe", "--gradinit-dropout 'maybe': expected true or false", "expected true or false"),
    ("optimizer", "lion", "--gradinit-optimizer 'lion': expected one of adam, sgd", "expected one of adam, sgd"),
    ("betas", "(0.9,)", "--gradinit-betas '(0.9,)' is invalid: expected two numbers, e.g. '(0.9, 0.98)'",
     "expected two numbers, e.g. '(0.9, 0.98)'"),
    ("scale_bounds", "7", "--gradinit-scale-bounds '7' is invalid: expected a list of (select, min, max), "
     "e.g. \"[('bias', 0, None), ('norm', None, 100)]\"",
     "expected a list of (select, min, max), e.g. \"[('bias', 0, None), ('norm', None, 100)]\""),
])
def test_an_option_refusal_carries_its_parts_and_keeps_its_text(name, text, message, reason):
    with pytest.raises(OptionValueError) as caught:
        SPECS[name].parse(text)
    e = caught.value
    assert isinstance(e, ValueError) and str(e) == message
    assert (e.flag, e.reason) == (SPECS[name].flag(), reason)
    assert e.flag + " " + e.detail == message
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.flag, back.detail, back.reason) == (
        OptionValueError, message, e.flag, e.detail, reason)


def test_a_bound_refused_by_scalebound_gives_its_reason():
    with pytest.raises(OptionValueError) as caught:
        parse_scale_bounds("[('bias', 2, 1)]", flag="--gradinit-init-clamp")
    e = caught.value
    assert e.flag == "--gradinit-init-clamp" and str(e) == f"--gradinit-init-clamp \"[('bias', 2, 1)]\" is invalid: {e.reason}"
    assert e.reason.startswith("scale bound ") and "below min_scale" in e.reason


def test_values_from_names_the_flag_of_a_number_python_refuses():
    class Source:
        gradinit_eta = "fast"

    with pytest.raises(OptionValueError) as caught:
        values_from(Source(), [SPECS["eta"]], prefix="gradinit_")
    e = caught.value
    assert str(e) == "--gradinit-eta: could not convert string to float: 'fast'"
    assert (e.flag, e.detail) == ("--gradinit-eta", "could not convert string to float: 'fast'")
    # the options' own refusals pass through as they are
    Source.gradinit_eta = "0.1"
    Source.gradinit_dropout = "maybe"
    with pytest.raises(OptionValueError, match=r"^--gradinit-dropout 'maybe': expected true or false$"):
        values_from(Source(), [SPECS["eta"], SPECS["dropout"]], prefix="gradinit_")


def test_argparse_words_an_option_refusal_with_its_flag_once(capsys):
    parser = argparse.ArgumentParser(prog="p")
    add_arguments(parser, [SPECS["optimizer"], SPECS["eta"]])
    with pytest.raises(SystemExit):
        parser.parse_args(["--gradinit-optimizer", "lion"])
    assert "p: error: argument --gradinit-optimizer: 'lion': expected one of adam, sgd\n" in capsys.readouterr().err


@pytest.mark.parametrize("value, message, reason", [
    ("(0.9, 1.5)", "--adam-betas (0.9, 1.5): expected two numbers in [0, 1), like '(0.9, 0.98)'",
     "expected two numbers in [0, 1), like '(0.9, 0.98)'"),
    ("nonsense(", "--adam-betas 'nonsense(': expected a pair like '(0.9, 0.98)'",
     "expected a pair like '(0.9, 0.98)'"),
    ("{1: 2}", "--adam-betas {1: 2}: expected two numbers in [0, 1), like '(0.9, 0.98)'",
     "expected two numbers in [0, 1), like '(0.9, 0.98)'"),
])
def test_adam_betas_refusals_carry_their_reason(value, message, reason):
    with pytest.raises(OptionValueError) as caught:
        parse_betas(value)
    assert (str(caught.value), caught.value.flag, caught.value.reason) == (message, "--adam-betas", reason)
