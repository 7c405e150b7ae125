"""``--gradinit-source-gap``: each validation also scored with the sources rolled across the batch."""
import json
import math
import logging

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq_gradinit.tools import curves  # noqa: E402
from fairseq_gradinit.fairseq_plugin.features import source_use  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import plugin_result_options  # noqa: E402

from fairseq_helpers import make_tiny_lm_bin  # noqa: E402
from fairseq_train import TINY_LM, TINY_MODEL, train_inprocess  # noqa: E402

METRICS = ("loss", "loss_src_rolled", "src_gap")


def _train(tiny_data, save, caplog, *extra):
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                         "--max-update", "4", "--validate-interval-updates", "2", "--no-save",
                         "--save-dir", str(save), *extra])
    lines = [r.getMessage() for r in caplog.records]
    return curves.parse_training_log(lines, valid_metrics=METRICS), lines


@pytest.fixture
def warn_from_the_start(monkeypatch):
    """The warning's rule at the tiny runs' scale: from update 0, a gap below 1e-4 bits, any loss."""
    monkeypatch.setattr(source_use, "GAP_WARN_FROM_UPDATE", 0)
    monkeypatch.setattr(source_use, "GAP_FLOOR", 1e-4)
    monkeypatch.setattr(source_use, "LOSS_DROP", -1e9)


@pytest.fixture
def silent_encoder(monkeypatch):
    """Every encoder's output multiplied by 0: a decoder that cannot see its source."""
    from fairseq.models.transformer import TransformerEncoderBase

    forward = TransformerEncoderBase.forward

    def silenced(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        out["encoder_out"] = [x * 0 for x in out["encoder_out"]]
        return out

    monkeypatch.setattr(TransformerEncoderBase, "forward", silenced)


def test_the_gap_is_on_by_default_and_leaves_the_training_alone(tiny_data, tmp_path, caplog, warn_from_the_start):
    got, lines = _train(tiny_data, tmp_path / "a", caplog)
    off, _ = _train(tiny_data, tmp_path / "b", caplog, "--gradinit-source-gap", "off")
    assert sorted(got["valid_src_gap"]) == [2, 4] and not off["valid_src_gap"]
    assert got["train_loss"] == off["train_loss"] and got["valid_loss"] == off["valid_loss"]
    for u in (2, 4):
        # the gap is the rolled loss minus the loss, as logged (both rounded to 3 decimals)
        assert got["valid_src_gap"][u] == pytest.approx(got["valid_loss_src_rolled"][u] - got["valid_loss"][u],
                                                        abs=2e-3)
        assert abs(got["valid_src_gap"][u]) > 1e-4
    assert not any("ignoring its source" in line for line in lines)


def test_a_model_that_ignores_its_source_is_warned_about(tiny_data, tmp_path, caplog, warn_from_the_start,
                                                         silent_encoder):
    got, lines = _train(tiny_data, tmp_path / "a", caplog, "--gradinit-monitor-interval", "2")
    assert got["valid_src_gap"] == {2: 0.0, 4: 0.0}
    warnings = [line for line in lines if "ignoring its source" in line]
    assert len(warnings) == 2 and all(len(w) < 300 for w in warnings)
    records = [json.loads(line) for line in (tmp_path / "a" / "monitor.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["type"] == "validation"]
    assert [r["update"] for r in valid] == [2, 4] and all(r["source_gap_warning"] for r in valid)
    assert all(abs(r["src_gap"]) < 1e-4 for r in valid)


def test_rolling_keeps_each_source_with_its_length():
    tokens = torch.tensor([[1, 5, 6, 2], [1, 1, 7, 2], [1, 8, 9, 2]])
    sample = {"id": torch.arange(3), "net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([3, 2, 3]),
                                                    "prev_output_tokens": torch.zeros(3, 2, dtype=torch.long)}}
    out = source_use.rolled(sample)
    assert out["net_input"]["src_tokens"].tolist() == [tokens[2].tolist(), tokens[0].tolist(), tokens[1].tolist()]
    assert out["net_input"]["src_lengths"].tolist() == [3, 3, 2]
    assert out["net_input"]["prev_output_tokens"] is sample["net_input"]["prev_output_tokens"]
    single = {"net_input": {"src_tokens": tokens[:1], "prev_output_tokens": torch.zeros(1, 2)}}
    assert source_use.rolled(single) is None


def test_warning_rule():
    """Batch 7 of the testbed: the warmup run and the run that ignored its source, as their logs say."""
    u, learned = source_use.GAP_WARN_FROM_UPDATE, dict(loss=8.22, first_loss=9.725)
    assert source_use.gap_warns(0.0, u, **learned)  # gi-look4-floors at update 500
    assert not source_use.gap_warns(0.0, u - 1, **learned)
    assert not source_use.gap_warns(0.786, u, loss=9.154, first_loss=9.96)  # warmup at 500
    assert not source_use.gap_warns(0.1, u, loss=9.5, first_loss=9.96)  # a long warmup that has not learned yet
    assert not source_use.gap_warns(source_use.GAP_FLOOR, u, **learned)
    assert not source_use.gap_warns(float("nan"), 10 ** 6, **learned)


def test_the_option_does_not_enter_the_fingerprint():
    assert "gradinit_source_gap" not in plugin_result_options()


def test_a_language_model_is_skipped_in_one_line(tmp_path, caplog):
    lm = make_tiny_lm_bin(tmp_path, {"train": 200, "valid": 30}, 500)
    with caplog.at_level(logging.INFO):
        train_inprocess([str(lm), "--user-dir", "fairseq_gradinit", "--arch", "transformer_lm", *TINY_LM,
                         "--max-update", "2", "--validate-interval-updates", "2", "--no-save",
                         "--save-dir", str(tmp_path / "ck")])
    lines = [r.getMessage() for r in caplog.records]
    assert sum("source gap: skipped" in line for line in lines) == 1
    got = curves.parse_training_log(lines, valid_metrics=METRICS)
    assert sorted(got["valid_loss"]) == [2] and not got["valid_src_gap"]


# -- the source contrast in GradInit's objective (--gradinit-source-contrast) ---------------------------------
def test_the_contrast_is_the_loss_plus_w_times_the_loss_minus_the_rolled_loss(tiny_data, tmp_path):
    """An independent reference: the criterion called on the sample and on its rolled copy by hand."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.data.loss import SOURCE_CONTRAST_KEY, SOURCE_MARGIN_KEY, MeanLoss

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--save-dir", str(tmp_path)])
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model, from_checkpoint=True), task.build_criterion(cfg.criterion)
    task.load_dataset("valid")
    sample = next(task.get_batch_iterator(task.dataset("valid"), max_tokens=400).next_epoch_itr(shuffle=False))
    model.eval()
    plain = MeanLoss(criterion)(model, sample)
    marked = MeanLoss(criterion)(model, {**sample, SOURCE_CONTRAST_KEY: 0.5})
    loss, size, _ = criterion(model, sample)
    tokens = sample["net_input"]["src_tokens"]
    other = {**sample, "net_input": {**sample["net_input"], "src_tokens": torch.cat([tokens[-1:], tokens[:-1]]),
                                     "src_lengths": torch.cat([sample["net_input"]["src_lengths"][-1:],
                                                               sample["net_input"]["src_lengths"][:-1]])}}
    rolled_loss, _, _ = criterion(model, other)
    assert plain.item() == pytest.approx(loss.item() / size)
    assert marked.item() == pytest.approx((loss.item() + 0.5 * (loss.item() - rolled_loss.item())) / size, rel=1e-6)
    assert marked.item() != pytest.approx(plain.item(), rel=1e-9)
    # with a margin (bits per token): lambda max(0, m - gap), the gap in nats over the sample
    gap = rolled_loss.item() - loss.item()
    for margin in (abs(gap) / size / math.log(2) + 1.0, 1e-6):
        hinge = MeanLoss(criterion)(model, {**sample, SOURCE_CONTRAST_KEY: 0.5, SOURCE_MARGIN_KEY: margin})
        short = max(0.0, margin * math.log(2) * size - gap)
        assert hinge.item() == pytest.approx((loss.item() + 0.5 * short) / size, rel=1e-6)


def test_a_phase_with_the_contrast_runs_and_changes_the_scales(tiny_data, tmp_path, caplog):
    common = ["--gradinit-iters", "3", "--gradinit-max-tokens", "400", "--max-update", "1", "--no-save",
              "--disable-validation"]
    runs = {}
    for name, extra in (("plain", []), ("contrast", ["--gradinit-source-contrast", "1"])):
        with caplog.at_level(logging.INFO):
            train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                             "--save-dir", str(tmp_path / name), *common, *extra])
        runs[name] = json.loads((tmp_path / name / "gradinit.json").read_text())
    assert runs["plain"]["scales"] != runs["contrast"]["scales"]
    plugin = runs["contrast"]["fingerprint"]["gradinit"]["plugin"]
    assert plugin["gradinit_source_contrast"] == 1.0
    # at its default the option stays out of the fingerprint: phases cached before it existed still match
    assert "gradinit_source_contrast" not in runs["plain"]["fingerprint"]["gradinit"]["plugin"]


def test_a_margin_without_the_contrast_is_refused_before_any_work():
    from fairseq_gradinit.fairseq_plugin.settings.validation import given_value_errors

    class Given:
        gradinit_iters, gradinit_max_tokens, gradinit_checkpoint_interval = 2, None, 50
        gradinit_init_clamp = gradinit_init_file = None
        gradinit_source_contrast, gradinit_source_margin = 0.0, 1.0

    errors = given_value_errors(Given())
    assert any("--gradinit-source-margin" in e and "--gradinit-source-contrast" in e for e in errors)
    Given.gradinit_source_contrast = 10.0
    assert given_value_errors(Given()) == []
    Given.gradinit_source_margin = -1.0
    assert any("--gradinit-source-margin: invalid value -1.0" in e for e in given_value_errors(Given()))
