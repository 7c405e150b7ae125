"""The plugin words a refused ``--gradinit-*`` value (an
:class:`~fairseq_gradinit.core.errors.OptionValueError`) from its attributes: the same line it gave when it
took the message's text apart, without the breakages of doing so (a value holding ': ' in --adam-betas, the
doubled colon after a flag whose value Python's float() refused)."""
import re

import pytest

pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402

from fairseq_gradinit.core.errors import OptionValueError  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings import plan as plan_module  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.option_values import gradinit_config_from_task  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import GradInitOptions  # noqa: E402
from fairseq_train import TINY_MODEL  # noqa: E402

BASE = dict(gradinit_iters=2, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=300)


def _worded_from_text(message):
    """How the plugin worded an option's refusal before it was structured: by cutting its text."""
    flag, _, rest = message.partition(" ")
    return f"argument {flag}: {rest}"


@pytest.mark.parametrize("settings", [
    dict(gradinit_dropout="maybe"),
    dict(gradinit_optimizer="lion"),
    dict(gradinit_betas="(0.9,)"),
    dict(gradinit_scale_bounds="7"),
    dict(gradinit_scale_bounds="[('bias', 2, 1)]"),
    dict(gradinit_train_lr=None),  # eta neither given nor derivable
])
def test_an_option_refusal_is_worded_as_it_was_from_its_text(settings):
    options_ = GradInitOptions(**{**BASE, **settings})
    with pytest.raises(OptionValueError) as caught:
        gradinit_config_from_task(options_)
    assert plan_module.build_plan(options_).error == _worded_from_text(str(caught.value))


def test_a_missing_init_file_is_worded_as_it_was_from_its_text(tmp_path):
    from fairseq_gradinit.fairseq_plugin.settings.init_file import read_init_file

    path = str(tmp_path / "nosuch.json")
    with pytest.raises(OptionValueError) as caught:
        read_init_file(path)
    assert (caught.value.flag, caught.value.reason) == ("--gradinit-init-file", "no such file")
    error = plan_module.build_plan(GradInitOptions(**{**BASE, "gradinit_init_file": path})).error
    assert error == _worded_from_text(str(caught.value)) == f"argument --gradinit-init-file: {path}: no such file"


def test_a_number_python_refuses_is_named_by_its_flag_with_one_colon():
    error = plan_module.build_plan(GradInitOptions(**{**BASE, "gradinit_lr": "fast"})).error
    assert error == "argument --gradinit-lr: could not convert string to float: 'fast'"


def test_adam_betas_holding_a_colon_are_refused_with_the_reason_only(tiny_data, tmp_path, capsys):
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--save-dir",
            str(tmp_path / "ck"), "--gradinit-iters", "780", "--adam-betas", "{1: 2}"]
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    err = capsys.readouterr().err
    assert re.search(r"error: argument --adam-betas: expected two numbers in \[0, 1\), like '\(0\.9, 0\.98\)' "
                     r"\(--optimizer adam\)\n", err), err[-800:]
