"""The health check of GradInit scales: lower bounds, LayerNorm gains by hand, verdicts."""
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInitConfig, apply_scales, gradinit
from fairseq_gradinit.core.health import (
    DEGENERATE, OK, HealthThresholds, ModelStructure, scale_health, scale_verdict, snapshot_weights,
)

DATA = Path(__file__).resolve().parents[1] / "data"


class PostLN(nn.Module):
    """Two Post-LN residual blocks: x -> LN(x + fc(x)); the first LayerNorm's output is the whole
    residual stream of the second block."""

    def __init__(self, d: int = 16, classes: int = 3):
        super().__init__()
        self.fc0, self.ln0 = nn.Linear(d, d), nn.LayerNorm(d)
        self.fc1, self.ln1 = nn.Linear(d, d), nn.LayerNorm(d)
        self.out = nn.Linear(d, classes)

    def forward(self, x):
        h = self.ln0(x + self.fc0(x))
        h = self.ln1(h + self.fc1(h))
        return self.out(h)


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def test_the_collapsed_d512_scales_are_flagged_from_the_scales_alone():
    saved = json.loads((DATA / "authors-d512-scales.json").read_text())
    health = scale_verdict(saved["scales"], config=saved["config"])
    assert health.verdict == DEGENERATE and not health.ok
    # Each tensor against its own bound: weights against 0.01, biases against their bound 0.
    assert (len(health.floor_weights), health.num_weights) == (20, 128)
    assert all(lo == 0.01 for _, lo in health.floor_weights.values())
    assert (len(health.floor_biases), health.num_biases) == (5, 78)
    assert all(v == 0.0 and lo == 0.0 for v, lo in health.floor_biases.values())
    assert "encoder.layers.1.fc1.bias" not in health.floor_biases  # 0.0046: below 0.01, above its bound 0
    assert "encoder.layers.2.self_attn.v_proj.weight" in health.floor_weights
    assert set(health.small_layer_norm_scales) == {"decoder.layers.3.final_layer_norm.weight",
                                                   "decoder.layers.4.final_layer_norm.weight"}
    text = " ".join(health.reasons)
    assert "20 of 128 weight tensors are at their lower bound" in text
    assert "decoder.layers.4.final_layer_norm.weight x0.0238" in text
    d = health.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["floor"]["weights"]["count"] == 20 and d["floor"]["weights"]["of"] == 128 and d["norms"] is None
    lines = health.table()
    assert lines[0] == "health: DEGENERATE" and any("gains: not measured" in line for line in lines)


def test_floor_uses_each_tensors_own_bound_and_the_allowance():
    scales = {"a.weight": 0.0099999998, "b.weight": 0.3, "c.weight": 0.5, "d.bias": 0.0, "e.bias": 0.004}
    cfg = {"min_scale": 0.01, "scale_bounds": [["bias", 0, None], ["re:^c\\.", 0.5, None]]}
    health = scale_verdict(scales, config=cfg)
    assert list(health.floor_weights) == ["a.weight", "c.weight"] and list(health.floor_biases) == ["d.bias"]
    # c.weight sits at a bound of 0.5, which keeps it alive: listed, not counted as switched off
    assert health.verdict == OK and "1 weight tensors sit at a lower bound of at least 0.1" in health.notes[-1]
    low = {"min_scale": 0.01, "scale_bounds": [["bias", 0, None], ["re:^c\\.", 0.05, None]]}
    health = scale_verdict({**scales, "c.weight": 0.05}, config=low)
    assert health.verdict == DEGENERATE  # 2 of 3 weights switched off > max(1, 5% of 3)
    lenient = scale_verdict({**scales, "c.weight": 0.05}, config=low, thresholds=HealthThresholds(floor_allowance=2))
    assert lenient.verdict == OK and lenient.reasons == []
    # without the file's bounds every tensor is held against the global 0.01
    assert list(scale_verdict(scales).floor_biases) == ["d.bias", "e.bias"]
    with pytest.raises(ValueError, match="floor_allowance"):
        HealthThresholds(floor_allowance=-1)
    # a Python selector needs the tensor: from the scales alone the global bound is used, and said so
    cfg = GradInitConfig(scale_bounds=[(lambda n, p: p.dim() > 1, 0.5, None)])
    guessed = scale_verdict({"a.weight": 0.5}, config=cfg)
    assert not guessed.floor_weights and "selector failed" in guessed.notes[0]
    model = PostLN()
    apply_scales(model, {"fc0.weight": 0.5})
    exact = scale_health(model, {"fc0.weight": 0.5}, None, config=cfg)
    assert list(exact.floor_weights) == ["fc0.weight"] and exact.norms is None
    assert exact.notes == ["1 weight tensors sit at a lower bound of at least 0.1 (scale_bounds): listed, "
                           "not counted as switched off"]


def _hand_ln1_input(model, x):
    with torch.no_grad():
        h = model.ln0(x + model.fc0(x))
        return h + model.fc1(h)


def test_layer_norm_gain_after_a_tiny_scale_matches_a_hand_computation():
    torch.manual_seed(0)
    model = PostLN()
    with torch.no_grad():
        for lin in (model.fc0, model.fc1):
            lin.bias.zero_()  # the residual stream is then all the next LayerNorm sees
    x, y = torch.randn(32, 16), torch.randint(0, 3, (32,))
    s_before = _hand_ln1_input(model, x).std(dim=1, unbiased=False).mean().item()
    initial = snapshot_weights(model)
    scales = {"ln0.weight": 0.02}
    apply_scales(model, scales)
    s_after = _hand_ln1_input(model, x).std(dim=1, unbiased=False).mean().item()
    state = {k: v.clone() for k, v in model.state_dict().items()}

    health = scale_health(model, scales, lambda m: loss_fn(m, (x, y)), initial=initial)
    norms = {n.name: n for n in health.norms}
    assert list(norms) == ["ln0", "ln1"] and all(n.kind == "layer_norm" for n in norms.values())
    ln1 = norms["ln1"]
    assert math.isclose(ln1.input_std_before, s_before, rel_tol=1e-5)
    assert math.isclose(ln1.input_std_after, s_after, rel_tol=1e-5)
    assert math.isclose(ln1.gain_before, 1.0 / s_before, rel_tol=1e-5)  # |gamma| = 1
    assert math.isclose(ln1.gain_after, 1.0 / s_after, rel_tol=1e-5)
    assert ln1.gain_ratio == pytest.approx(s_before / s_after) and ln1.gain_ratio > 20
    ln0 = norms["ln0"]  # its input is not scaled, its gamma is
    assert ln0.input_std_after == pytest.approx(ln0.input_std_before, rel=1e-6)
    assert ln0.gain_ratio == pytest.approx(0.02, rel=1e-5)
    assert health.verdict == DEGENERATE
    assert any("ln1" in r and "LayerNorms amplify their input" in r for r in health.reasons), health.reasons
    assert health.worst_norms(1)[0].name == "ln1"
    # the model is left as it was (the scaled weights), in train mode
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items()) and model.training
    # without the weights before, only the absolute gain is judged
    alone = scale_health(model, scales, lambda m: loss_fn(m, (x, y)))
    assert alone.norms[1].gain_before is None and alone.verdict == DEGENERATE
    # the gain verdict replaces the scale-only guess when measured: a tiny ln1 scale feeds no LayerNorm
    model2 = PostLN()
    initial2 = snapshot_weights(model2)
    apply_scales(model2, {"ln1.weight": 0.02})
    tail = scale_health(model2, {"ln1.weight": 0.02}, lambda m: loss_fn(m, (x, y)), initial=initial2)
    assert tail.verdict == OK and tail.small_layer_norm_scales == {"ln1.weight": 0.02}
    assert scale_verdict({"ln1.weight": 0.02}).verdict == DEGENERATE  # scales alone: flagged


def test_a_short_gradinit_on_a_small_model_is_ok():
    torch.manual_seed(1)
    model = PostLN()
    batches = [(torch.randn(16, 16), torch.randint(0, 3, (16,))) for _ in range(4)]
    initial = snapshot_weights(model)
    cfg = GradInitConfig(iters=6, lr=0.01, eta=1e-3, gamma=100.0, optimizer="adam")
    result = gradinit(model, batches, loss_fn, cfg)
    assert min(result.scales.values()) > 0.5
    health = scale_health(model, result.scales, lambda m: loss_fn(m, batches[-1]), initial=initial, config=cfg,
                          loss=lambda m: loss_fn(m, batches[-1]), history=result.history, gamma=result.gamma)
    assert health.verdict == OK and health.reasons == [] and not health.floor_weights
    assert health.phase.objective > 0 and all(b.quieting < 2 for b in health.blocks) and not health.pairs_off
    assert all(n.gain_after < 4 for n in health.norms) and health.table()[0] == "health: OK"


def test_with_a_loss_each_weight_state_costs_one_pass_and_measures_what_two_passes_measured():
    torch.manual_seed(2)
    model = PostLN()
    batch = (torch.randn(16, 16), torch.randint(0, 3, (16,)))
    initial = snapshot_weights(model)
    scales = {"ln0.weight": 0.3, "fc1.weight": 2.0}
    apply_scales(model, scales)
    calls = []

    def counted(m):
        calls.append(torch.is_grad_enabled())
        return loss_fn(m, batch)

    fused = scale_health(model, scales, counted, initial=initial, loss=counted)
    assert calls == [True, True]  # after and before the scales, each one forward and backward
    calls.clear()
    norms_alone = scale_health(model, scales, counted, initial=initial)
    blocks_alone = scale_health(model, scales, None, initial=initial, loss=counted)
    assert calls == [False, False, True, True]
    assert [b.to_dict() for b in fused.blocks] == [b.to_dict() for b in blocks_alone.blocks]
    assert [n.name for n in fused.norms] == [n.name for n in norms_alone.norms] == ["ln0", "ln1"]
    for a, b in zip(fused.norms, norms_alone.norms):
        for key in ("input_std_after", "gain_after", "input_std_before", "gain_before"):
            assert getattr(a, key) == pytest.approx(getattr(b, key), rel=1e-6), (a.name, key)
    assert fused.verdict == norms_alone.verdict


def test_docs_state_the_default_thresholds_and_a_usable_bounds_example():
    import dataclasses
    import re

    from fairseq_gradinit.core.options import parse_scale_bounds

    doc = (Path(__file__).resolve().parents[2] / "docs" / "health.md").read_text()
    for f in dataclasses.fields(HealthThresholds):
        assert f"| `{f.name}` | {f.default} |" in doc, f.name
    schema = doc[doc.index("## The `health` block"):]
    d = scale_verdict({"a.weight": 1.0}, history=[{"branch": "objective", "grad_norm": 1.0}], gamma=2.0).to_dict()
    from fairseq_gradinit.core.health import BlockGradient

    block = BlockGradient(name="b", rms_after=1.0, rms_before=2.0).to_dict()
    for key in list(d) + list(d["floor"]["weights"]) + list(d["thresholds"]) + list(d["phase"]) + list(block):
        assert f'"{key}"' in schema, key
    for key, value in d["thresholds"].items():
        assert f'"{key}": {value}' in schema, key
    example = re.search(r'--gradinit-scale-bounds "(\[.*?\])"', doc).group(1)
    bounds = parse_scale_bounds(example)
    assert [b.select for b in bounds] == ["bias", "norm", "re:."] and bounds[2].min_scale == 0.1
    # the measured table is the committed measurement
    measured = json.loads((Path(__file__).resolve().parents[2] / "docs" / "health-authors-d512.json").read_text())
    health = measured["health"]
    assert health["verdict"] == DEGENERATE and health["floor"]["weights"]["count"] == 20
    # its tables of LayerNorm gains and block gradients are generated: tests/repo/test_generated_docs.py

def test_plugin_check_failure_is_recorded_not_raised(caplog):
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.features.health import measure_health

    model = PostLN()

    def broken_criterion(m, sample):
        raise RuntimeError("no such field")

    out = measure_health(model, {"ln0.weight": 1.0}, broken_criterion, {"x": 1}, initial=None, config=None)
    assert out == {"verdict": "unknown", "error": "RuntimeError: no such field"}
    assert "the health check failed" in caplog.text
    scales_only = measure_health(model, {"ln0.weight": 0.02}, broken_criterion, None, initial=None, config=None)
    assert scales_only["verdict"] == DEGENERATE and scales_only["norms"] is None


def test_the_caller_gives_the_pairs_and_the_blocks():
    """The engine assumes no module names: without a structure no pair is checked and blocks go by numbered
    modules; a ModelStructure's pairs and block pattern decide both, on the same scales and model."""
    from fairseq_gradinit.core.health import ModelStructure, block_gradient_rms

    scales = {"m.a.weight": 0.01, "m.b.weight": 0.015, "m.c.weight": 1.0, "n.a.weight": 0.01, "n.b.weight": 0.5}
    lenient = HealthThresholds(floor_allowance=10)
    assert scale_verdict(scales, thresholds=lenient).ok and not scale_verdict(scales, thresholds=lenient).pairs_off
    paired = scale_verdict(scales, thresholds=lenient, structure=ModelStructure(pairs=[("a", "b")]))
    assert paired.pairs_off == [["m.a.weight", "m.b.weight", 0.01, 0.015]] and paired.verdict == DEGENERATE
    assert "1 multiplicative pairs are switched off together" in paired.reasons[0]

    torch.manual_seed(0)
    model, batch = PostLN(), (torch.randn(8, 16), torch.randint(0, 3, (8,)))
    generic = block_gradient_rms(model, lambda m: loss_fn(m, batch))
    assert list(generic) == ["fc0", "ln0", "fc1", "ln1", "out"]
    grouped = block_gradient_rms(model, lambda m: loss_fn(m, batch), structure=ModelStructure(blocks=r"\w+?(?=\d)"))
    assert list(grouped) == ["fc", "ln", "out"]  # fc0+fc1, ln0+ln1; "out" has no digit: its module
    sq = {k: v ** 2 * n for k, v, n in [(k, generic[k], sum(p.numel() for name, p in model.named_parameters()
                                                            if name.startswith(k + "."))) for k in generic]}
    n_fc = sum(p.numel() for name, p in model.named_parameters() if name.startswith("fc"))
    assert grouped["fc"] == pytest.approx(math.sqrt((sq["fc0"] + sq["fc1"]) / n_fc), rel=1e-12)
    with pytest.raises(ValueError, match="expected pairs of module names"):
        ModelStructure(pairs=[("a",)])
    with pytest.raises(ValueError, match="expected a regular expression"):
        ModelStructure(blocks="(")


def test_pinned_tensors_are_not_switched_off_and_encoder_silencing_is_named():
    """A tensor whose bounds pin it (min = max) stays where the user put it: neither at a floor nor half of a
    pair switched off. An encoder-decoder model whose encoder blocks the scales quieted far more than its
    decoder's gets the encoder-silencing reason (batch 7's floors phase: 27x)."""
    from fairseq_gradinit.core.health import BlockGradient, encoder_silencing, shock_reasons

    scales = {"enc.q.weight": 1.0, "enc.k.weight": 1.0, "dec.weight": 0.5}
    cfg = {"min_scale": 0.01, "scale_bounds": [["re:^enc\\.", 1, 1]]}
    health = scale_verdict(scales, config=cfg, structure=ModelStructure(pairs=(("q", "k"),)))
    assert health.verdict == OK and not health.floor_weights and not health.pairs_off
    blocks = [BlockGradient(f"encoder.layers.{i}", 1.0, 27.0) for i in range(3)] + \
        [BlockGradient(f"decoder.layers.{i}", 1.0, 1.0) for i in range(3)]
    sides = ("encoder", "decoder")  # the caller names them (the fairseq plugin does so)
    assert encoder_silencing(blocks, sides)["ratio"] == pytest.approx(27.0)
    assert encoder_silencing(blocks) is None  # no sides named: not an encoder-decoder check
    reasons = shock_reasons(blocks, None, [], HealthThresholds(), sides=sides)
    assert len(reasons) == 1 and reasons[0].startswith("the encoder's blocks are 27x quieter") and len(reasons[0]) < 200
    even = [BlockGradient(b.name, 1.0, 5.0) for b in blocks]
    assert shock_reasons(even, None, [], HealthThresholds(), sides=sides) == []
    assert encoder_silencing([BlockGradient("layers.0", 1.0, 9.0)], sides) is None  # neither side has a block


def test_a_phase_whose_loss_on_s_rose_is_degenerate_and_says_by_how_much():
    from fairseq_gradinit.core.health import scale_verdict

    def history(last):
        losses = [9.0] + [9.0 + (last - 9.0) * i / 29 for i in range(1, 30)]
        return [{"iteration": i + 1, "branch": "objective", "loss_s": v, "grad_norm": 1.0}
                for i, v in enumerate(losses)]

    scales = {"a.weight": 1.0, "b.weight": 0.9}
    risen = scale_verdict(scales, history=history(10.5), gamma=2.0)
    assert risen.verdict == "degenerate"
    assert any("rose from 9 to" in r and "more than 10 %" in r for r in risen.reasons), risen.reasons
    assert risen.phase.first_loss == 9.0 and risen.phase.loss_rise > 0.1
    steady = scale_verdict(scales, history=history(9.4), gamma=2.0)  # +4 %: within the threshold
    assert steady.verdict == "ok" and steady.phase.loss_rise < 0.1
    assert scale_verdict(scales, history=history(10.5), gamma=2.0,
                         thresholds=HealthThresholds(max_loss_rise=0.5)).verdict == "ok"
