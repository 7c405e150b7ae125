"""Issue 51's cases in the fairseq plugin: scales that float32 makes 0 or inf, scales whose gradient is not
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
    from fairseq_gradinit.fairseq_plugin.features.health_report import nonfinite_blocks
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
        values = {"gradinit_adam_betas": betas, "gradinit_train_optimizer": optimizer}
        return types.SimpleNamespace(setting=lambda name, default=None: values.get(name) or default)

    cfg = GradInitConfig(lookahead_steps=4)
    # before: (0.9, 0.98) simulated without a word under --adam-betas '(0.9, 0.999)'
    assert simulated_betas_note(plan("(0.9, 0.999)"), cfg) == (
        "the objective simulates 4 Adam steps with betas (0.9, 0.98) (--gradinit-lookahead-betas), not the "
        "training's --adam-betas (0.9, 0.999); pass --gradinit-lookahead-betas '(0.9, 0.999)' to simulate the "
        "steps training takes")
    assert simulated_betas_note(plan(None), cfg) is not None  # fairseq's default (0.9, 0.999)
    assert simulated_betas_note(plan("(0.9, 0.98)"), cfg) is None
    assert simulated_betas_note(plan("(0.9, 0.999)", "sgd"), cfg) is None
    assert simulated_betas_note(plan("(0.9, 0.999)"), GradInitConfig(lookahead_steps=1)) is None
