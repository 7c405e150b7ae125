"""The health check's view of a delayed no-warmup shock: blocks the scales silenced (gradient RMS by hand),
a constraint-bound phase, multiplicative pairs switched off together; the d=512 scales are flagged for all three."""
import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInitConfig, apply_scales, gradinit
from fairseq_gradinit.core.health import (
    DEGENERATE, OK, HealthThresholds, block_of, phase_health, scale_health, scale_verdict, snapshot_weights,
)

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "lab" / "record" / "evidence" / "nowarmup-d512-authors-2026-11-26" / "authors.gradinit.json"


class Stack(nn.Module):
    """Two numbered tanh layers and a head: blocks ``layers.0``, ``layers.1`` and ``head``."""

    def __init__(self, d=8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(2))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def hand_rms(model, batch):
    """Per block, sqrt(sum of squared gradients / number of elements), by plain autograd in eval mode."""
    model = copy.deepcopy(model).eval()
    named = list(model.named_parameters())
    grads = torch.autograd.grad(loss_fn(model, batch), [p for _, p in named])
    out = {}
    for (name, p), g in zip(named, grads):
        key = "head" if name.startswith("head") else ".".join(name.split(".")[:2])
        sq, n = out.get(key, (0.0, 0))
        out[key] = (sq + float(g.double().pow(2).sum()), n + p.numel())
    return {k: math.sqrt(sq / n) for k, (sq, n) in out.items()}


def test_block_names():
    assert block_of("encoder.layers.3.self_attn.q_proj.weight") == "encoder.layers.3"
    assert block_of("decoder.embed_tokens.weight") == "decoder.embed_tokens"
    assert block_of("layer1.0.conv1.weight") == "layer1.0" and block_of("fc.bias") == "fc"


def test_a_block_silenced_by_a_layer_norm_scale_is_flagged_with_its_hand_computed_rms():
    torch.manual_seed(0)
    model = Stack()
    batch = (torch.randn(16, 8), torch.randint(0, 3, (16,)))
    before = hand_rms(model, batch)
    initial = snapshot_weights(model)
    # every path from layers.0 to the loss goes through layers.1's weight: scaled by 1e-3, it leaves
    # layers.0's gradient about 1000 times quieter, and layers.1's own gradient as it was
    scales = {"layers.1.weight": 1e-3}
    apply_scales(model, scales)
    after = hand_rms(model, batch)
    health = scale_health(model, scales, None, initial=initial, loss=lambda m: loss_fn(m, batch))
    blocks = {b.name: b for b in health.blocks}
    assert list(blocks) == ["layers.0", "layers.1", "head"]
    for name, b in blocks.items():
        assert b.rms_before == pytest.approx(before[name], rel=1e-5)
        assert b.rms_after == pytest.approx(after[name], rel=1e-5)
        assert b.quieting == pytest.approx(before[name] / after[name], rel=1e-5)
    assert blocks["layers.0"].quieting > 100 and max(blocks["layers.1"].quieting, blocks["head"].quieting) < 10
    assert health.verdict == DEGENERATE
    assert any("1 blocks have a gradient rms at least 100 times below" in r and "layers.0" in r
               for r in health.reasons), health.reasons
    assert health.quietest_blocks(1)[0].name == "layers.0"
    d = health.to_dict()
    assert json.loads(json.dumps(d)) == d and d["blocks"][0]["name"] == "layers.0"
    lenient = scale_health(model, scales, None, initial=initial, loss=lambda m: loss_fn(m, batch),
                           thresholds=HealthThresholds(max_block_quieting=1e9, floor_allowance=5))
    assert lenient.blocks[0].quieting == blocks["layers.0"].quieting
    assert lenient.verdict == OK, lenient.reasons


def test_a_phase_without_objective_iterations_is_never_ok():
    torch.manual_seed(0)
    model = Stack()
    data = [(torch.randn(12, 8), torch.randint(0, 3, (12,))) for _ in range(3)]
    result = gradinit(model, data, loss_fn, GradInitConfig(eta=1e-3, gamma=1e-6, iters=3, lr=1e-3))
    assert result.num_objective == 0 and result.num_constraint == 3
    health = scale_verdict(result.scales, history=result.history, gamma=result.gamma)
    assert health.verdict == DEGENERATE and health.phase.objective == 0
    assert any(r.startswith("no objective iteration ran: all 3 iterations") for r in health.reasons)
    # the vision API judges its own phase
    from fairseq_gradinit.vision import gradinit as vision_gradinit

    res = vision_gradinit(Stack(), data, loss_fn=loss_fn, optimizer="adam", eta=1e-3, gamma=1e-6, iters=3,
                          progress=False)
    assert not res.health.ok and any("no objective iteration ran" in r for r in res.health.reasons)
    assert res.to_dict()["health"]["phase"]["constraint"] == 3


def test_constraint_share_and_first_norm_thresholds():
    def hist(branches, first=5.0):
        return [{"branch": b, "grad_norm": first if i == 0 else 1.0} for i, b in enumerate(branches)]

    # alternating at the bound: half constraint iterations, ||g|| at iteration 1 below 10 gamma
    ok = phase_health(hist(["constraint", "objective"] * 10), gamma=1.0)
    assert ok.constraint_share == 0.5 and ok.initial_norm_ratio == 5.0
    assert scale_verdict({"a.weight": 1.0}, history=hist(["constraint", "objective"] * 10), gamma=1.0).ok
    bound = scale_verdict({"a.weight": 1.0}, history=hist(["constraint"] * 7 + ["objective"] * 3), gamma=1.0)
    assert not bound.ok and "7 of 10 iterations were constraint iterations (70%, more than 60%)" in bound.reasons[0]
    # a start far above gamma flags nothing once the phase alternates (the vision demo: 9 of 39 constraint)
    far = scale_verdict({"a.weight": 1.0}, history=hist(["constraint", "objective"] * 5, first=25.0), gamma=2.0)
    assert far.ok and far.phase.initial_norm_ratio == 12.5
    demo = scale_verdict({"a.weight": 1.0}, history=hist(["constraint"] * 9 + ["objective"] * 30, first=13.5),
                         gamma=1.0)
    assert demo.ok and "(23% constraint)" in "\n".join(demo.table())
    # ... and is named as the cause of a phase over the share
    both = scale_verdict({"a.weight": 1.0}, history=hist(["constraint"] * 7 + ["objective"] * 3, first=25.0),
                         gamma=2.0)
    assert len(both.reasons) == 1 and "(70%, more than 60%) and ||g|| at iteration 1 was 12.5 times gamma" \
        in both.reasons[0]
    skipped_first = [{"branch": "skipped", "grad_norm": float("nan")}] + hist(["objective"], first=3.0)
    assert phase_health(skipped_first, 1.0).first_grad_norm == 3.0


def test_pairs_switched_off_together_against_their_own_bounds():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.features.health import FAIRSEQ_STRUCTURE as fairseq

    scales = {"a.q_proj.weight": 0.01, "a.k_proj.weight": 0.02, "b.fc1.weight": 0.01, "b.fc2.weight": 0.5,
              "c.v_proj.weight": 0.0150, "c.out_proj.weight": 0.012, "d.q_proj.weight": 0.3, "d.k_proj.weight": 0.3,
              "c.v_proj.bias": 0.0}
    health = scale_verdict(scales, thresholds=HealthThresholds(floor_allowance=10), structure=fairseq)
    assert [p[:2] for p in health.pairs_off] == [["a.q_proj.weight", "a.k_proj.weight"],
                                                 ["c.v_proj.weight", "c.out_proj.weight"]]
    assert health.verdict == DEGENERATE and "2 multiplicative pairs are switched off together" in health.reasons[0]
    # a pair whose own lower bound is higher is near its floor at a higher scale
    raised = scale_verdict({"e.fc1.weight": 0.15, "e.fc2.weight": 0.2},
                           config={"min_scale": 0.01, "scale_bounds": [["re:fc", 0.1, None]]}, structure=fairseq)
    assert len(raised.pairs_off) == 1 and scale_verdict({"e.fc1.weight": 0.15, "e.fc2.weight": 0.2},
                                                        structure=fairseq).ok


@pytest.fixture(scope="module")
def d512():
    """The d=512 Post-LN Transformer of the collapsed run (transformer_iwslt_de_en, decoder input and
    output embeddings tied), on a small dictionary (the scales are per tensor) and a short batch."""
    pytest.importorskip("fairseq")
    from fairseq_helpers import make_tiny_bin
    import fairseq_gradinit.fairseq_plugin  # noqa: F401
    from fairseq_gradinit.fairseq_plugin.data.training import build_training_model, collate, training_dataset
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="d512-"))
    data = make_tiny_bin(root, {"train": 20, "valid": 5, "test": 5}, 600)
    fm = build_training_model([str(data), "--task", "translation", "--arch", "transformer_iwslt_de_en",
                               "--share-decoder-input-output-embed", "--criterion", "label_smoothed_cross_entropy",
                               "--label-smoothing", "0.1", "--max-tokens", "4096", "--seed", "1", "--cpu",
                               "--optimizer", "adam", "--lr", "5e-4"])
    return fm, collate(training_dataset(fm.task), [0, 1, 2, 3], "cpu")


def test_the_collapsed_d512_scales_are_flagged_for_all_three(d512):
    from fairseq_gradinit.fairseq_plugin.settings.init_file import saved_gamma
    from fairseq_gradinit.fairseq_plugin.data.loss import mean_loss_fn
    from fairseq_gradinit.fairseq_plugin.features.health import FAIRSEQ_STRUCTURE

    fm, sample = d512
    saved = json.loads(EVIDENCE.read_text())
    initial = snapshot_weights(fm.model)
    apply_scales(fm.model, saved["scales"])
    loss = mean_loss_fn(fm.criterion)
    health = scale_health(fm.model, saved["scales"], None, initial=initial, config=saved["config"],
                          loss=lambda m: loss(m, sample), history=saved["history"], gamma=saved_gamma(saved),
                          structure=FAIRSEQ_STRUCTURE)
    quiet = {b.name: b.quieting for b in health.blocks}
    assert min(quiet[f"decoder.layers.{i}"] for i in (0, 1)) > 150  # the evidence: about 240x on its batch
    assert quiet["decoder.layers.2"] > 100
    assert max(quiet[f"decoder.layers.{i}"] for i in (4, 5)) < 20  # the layers that kept learning
    text = "\n".join(health.reasons)
    assert "3 blocks have a gradient rms at least 100 times below" in text
    assert health.phase.constraint == 556 and health.phase.iterations == 780
    assert health.phase.initial_norm_ratio == pytest.approx(18.283, rel=1e-4)
    assert "the phase was constraint-bound: 556 of 780 iterations" in text
    pairs = {(a.rsplit(".", 2)[0], a.split(".")[-2]) for a, *_ in health.pairs_off}
    assert {("encoder.layers.0.self_attn", "q_proj"), ("encoder.layers.2.self_attn", "v_proj"),
            ("encoder.layers.5", "fc1")} <= pairs and len(pairs) == 11
    assert "11 multiplicative pairs are switched off together" in text
    assert health.verdict == DEGENERATE
    # each reason is one line a user reads whole, with one example; every detail is in gradinit.json's block
    assert len(health.reasons) >= 4 and all(len(r) < 200 and "\n" not in r for r in health.reasons), health.reasons
    d = health.to_dict()
    assert len(d["pairs_off"]) == 11 and d["phase"]["first_grad_norm"] and d["floor"]["weights"]["names"]


def test_the_docs_quote_the_stored_d512_measurement():
    doc = (REPO / "docs" / "health.md").read_text(encoding="utf-8")
    stored = json.loads((REPO / "docs" / "health-authors-d512.json").read_text())
    health = stored["health"]
    quiet = {b["name"]: b["quieting"] for b in health["blocks"]}
    # the table of decoder blocks is generated (lab/docs_tables/health.py); which of them are flagged:
    flagged = sorted(n for n, q in quiet.items() if q >= health["thresholds"]["max_block_quieting"])
    assert flagged == ["decoder.layers.0", "decoder.layers.1", "decoder.layers.2"]
    assert "Three blocks have a gradient at least 100 times quieter" in doc
    encoder = max((n for n in quiet if n.startswith("encoder.layers.")), key=quiet.get)
    assert f"The quietest encoder block is `{encoder}` ({quiet[encoder]:.1f})" in doc
    p = health["phase"]
    text = " ".join(doc.split())
    assert (f"{p['constraint']} of its {p['iterations']} iterations ({100 * p['constraint_share']:.0f}%) were "
            f"constraint iterations, and ‖g‖₁ at iteration 1 was {p['first_grad_norm']:,.0f}, which is "
            f"{p['initial_norm_ratio']:.1f} times γ = {p['gamma']:.0f}") in text
    by_kind = {}
    for a, *_ in health["pairs_off"]:
        by_kind.setdefault(a.split(".")[-2], []).append(int(a.split(".")[2]))
    assert all(a.startswith("encoder.") for a, *_ in health["pairs_off"])
    assert by_kind == {"q_proj": [0, 1, 4], "v_proj": [2, 3], "fc1": list(range(6))}
    assert f"{len(health['pairs_off'])} multiplicative pairs were switched off together, all in the encoder" in text
    assert f"took {stored['meta']['wall_time']:.0f} s on a CPU shared with other jobs" in text
