"""language_modeling with every --sample-break-mode, GradInit on: fairseq 0.12's eos mode calls
np.compat.long, which numpy 2 removed; the plugin lets those fairseq modules run on numpy 2."""
import json

import pytest

pytest.importorskip("fairseq")

from fairseq_helpers import make_tiny_lm_bin  # noqa: E402
from fairseq_train import TINY_LM, train  # noqa: E402


@pytest.fixture(scope="module")
def lm_bin(tmp_path_factory):
    return make_tiny_lm_bin(tmp_path_factory.mktemp("lmbreak"), {"train": 200, "valid": 40}, 400)


@pytest.mark.parametrize("mode", ["none", "complete", "complete_doc", "eos"])
def test_language_model_trains_with_gradinit_in_every_sample_break_mode(lm_bin, tmp_path, mode):
    save = tmp_path / mode
    train([str(lm_bin), "--arch", "transformer_lm_postln", *TINY_LM, "--sample-break-mode", mode,
           "--max-update", "1", "--save-dir", str(save), "--gradinit-iters", "1"])
    assert json.loads((save / "gradinit.json").read_text())["iterations"] == 1
    assert (save / "checkpoint_last.pt").is_file()
