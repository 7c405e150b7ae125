"""``--gradinit-valid-dropout-loss``: each validation also scored with dropout on, logged as loss_dropout."""
import logging

import pytest

pytest.importorskip("fairseq")

from fairseq_gradinit.tools import curves  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import plugin_result_options  # noqa: E402

from fairseq_helpers import make_tiny_lm_bin  # noqa: E402
from fairseq_train import TINY_LM, TINY_MODEL, train_inprocess  # noqa: E402


def _train(tiny_data, save, caplog, *extra, dropout="0.1"):
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                         "--dropout", dropout, "--max-update", "4", "--validate-interval-updates", "2",
                         "--no-save", "--save-dir", str(save), *extra])
    lines = [r.getMessage() for r in caplog.records]
    return curves.parse_training_log(lines, valid_metrics=("loss", "loss_dropout"))


def test_dropout_loss_beside_eval_loss_and_training_unchanged(tiny_data, tmp_path, caplog):
    plain = _train(tiny_data, tmp_path / "a", caplog)
    both = _train(tiny_data, tmp_path / "b", caplog, "--gradinit-valid-dropout-loss")
    again = _train(tiny_data, tmp_path / "c", caplog, "--gradinit-valid-dropout-loss")
    assert sorted(both["valid_loss_dropout"]) == [2, 4] and not plain["valid_loss_dropout"]
    # the extra pass neither changes the training nor the eval-mode validation
    assert both["train_loss"] == plain["train_loss"] and both["valid_loss"] == plain["valid_loss"]
    # dropout on scores the same model differently, and the same each time (masks from --seed)
    assert all(both["valid_loss_dropout"][u] != both["valid_loss"][u] for u in (2, 4))
    assert again["valid_loss_dropout"] == both["valid_loss_dropout"]


def test_without_dropout_both_losses_agree(tiny_data, tmp_path, caplog):
    """Train mode without dropout is eval mode: the two losses are the same number."""
    got = _train(tiny_data, tmp_path / "a", caplog, "--gradinit-valid-dropout-loss", dropout="0")
    assert got["valid_loss_dropout"] == got["valid_loss"] and len(got["valid_loss"]) == 2


def test_the_option_does_not_enter_the_fingerprint():
    assert "gradinit_valid_dropout_loss" not in plugin_result_options()


def test_language_modeling_task_logs_it_too(tmp_path, caplog):
    """Any task the plugin serves with a dataclass config: fairseq's language_modeling (cross_entropy)."""
    lm = make_tiny_lm_bin(tmp_path, {"train": 200, "valid": 30}, 500)
    with caplog.at_level(logging.INFO):
        train_inprocess([str(lm), "--user-dir", "fairseq_gradinit", "--arch", "transformer_lm", *TINY_LM,
                         "--dropout", "0.2", "--max-update", "2", "--validate-interval-updates", "2", "--no-save",
                         "--save-dir", str(tmp_path / "ck"), "--gradinit-valid-dropout-loss"])
    got = curves.parse_training_log([r.getMessage() for r in caplog.records], valid_metrics=("loss", "loss_dropout"))
    assert sorted(got["valid_loss_dropout"]) == [2] and got["valid_loss_dropout"][2] != got["valid_loss"][2]
