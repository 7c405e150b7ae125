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
