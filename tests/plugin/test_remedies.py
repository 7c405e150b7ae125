"""Remedies for degenerate GradInit scales: clamping saved scales, and higher floors per group."""
import json

import pytest
import torch
from torch import nn

from fairseq_gradinit.core import GradInitConfig, ScaledParameters, gradinit
from fairseq_gradinit.core.scales import clamp_scales

LEVELS = "[('norm', 0.3, None), ('re:.', 0.1, None)]"


class PostLN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.layer_norm = nn.LayerNorm(6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(self.layer_norm(x + torch.relu(self.fc1(x))))


def test_clamp_scales_raises_each_group_to_its_floor_and_reports_every_change():
    model = PostLN()
    scales = {"fc1.weight": 0.01, "fc1.bias": 0.0, "layer_norm.weight": 0.04, "layer_norm.bias": 0.2,
              "fc2.weight": 1.7, "fc2.bias": 0.05}
    bounds = [("bias", None, None), ("norm", 0.3, None), ("re:.", 0.1, None)]
    out = clamp_scales(model, scales, bounds)
    assert out["scales"] == {"fc1.weight": 0.1, "fc1.bias": 0.0, "layer_norm.weight": 0.3, "layer_norm.bias": 0.2,
                             "fc2.weight": 1.7, "fc2.bias": 0.05}
    assert out["changed"] == {"fc1.weight": [0.01, 0.1], "layer_norm.weight": [0.04, 0.3]}
    # a bound with a maximum lowers; a tensor no bound selects is left alone
    out = clamp_scales(model, scales, [("re:^fc2\\.weight$", None, 1.0)])
    assert out["changed"] == {"fc2.weight": [1.7, 1.0]}


def test_scale_bounds_express_a_higher_floor_per_group_and_gradinit_respects_it():
    torch.manual_seed(0)
    model = PostLN()
    bounds = (("bias", 0, None), ("norm", 0.3, 100), ("re:.", 0.1, None))
    cfg = GradInitConfig(eta=0.1, gamma=1e-3, lr=0.5, iters=15, scale_bounds=bounds)  # constraint steps push down
    sp = ScaledParameters(model, bounds=cfg.scale_bounds, min_scale=cfg.min_scale)
    floors = dict(zip(sp.names, sp.min_scales.tolist()))
    # (the LayerNorm bias starts at zero: no scale)
    assert floors == pytest.approx({"fc1.weight": 0.1, "fc1.bias": 0.0, "layer_norm.weight": 0.3,
                                    "fc2.weight": 0.1, "fc2.bias": 0.0})
    def run(**kw):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(4)]
        return gradinit(PostLN(), data, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), cfg, **kw)

    free = run(scale_bounds=())
    below = [n for n, v in free.scales.items() if v < floors[n] - 1e-6]
    assert below, free.scales  # without the floors some scale goes below them
    res = run()
    assert all(res.scales[n] >= floors[n] - 1e-7 for n in res.scales)
    assert any(res.scales[n] == pytest.approx(floors[n]) for n in below)


fairseq = pytest.importorskip("fairseq")


def test_init_clamp_applies_clamped_scales_and_records_them(tmp_path):
    from fairseq_train import TINY_MODEL, checkpoint_state, fresh_model, train_inprocess
    from fairseq_helpers import make_tiny_bin

    data = make_tiny_bin(tmp_path, {"train": 60, "valid": 10, "test": 10}, 300)
    common = [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "0", "--max-update", "1"]
    model = fresh_model(common + ["--save-dir", str(tmp_path / "unused")])
    names = [n for n, _ in model.named_parameters()]
    scales = {n: (0.02 if "layer_norm" in n and n.endswith("weight") else 0.01 if n.endswith("weight") else 0.5)
              for n in names}
    src = tmp_path / "degenerate.json"
    src.write_text(json.dumps({"scales": scales}))
    save = tmp_path / "ck"
    train_inprocess(common + ["--save-dir", str(save), "--gradinit-init-file", str(src),
                              "--gradinit-init-clamp", LEVELS])
    record = json.loads((save / "gradinit.json").read_text())
    want = {n: (0.3 if "layer_norm" in n and n.endswith("weight") else 0.1 if n.endswith("weight") else 0.5)
            for n in names}
    assert record["scales"] == pytest.approx(want)
    # the degenerate file's verdict is recorded with the clamped scales: no weight left at the floor
    from fairseq_gradinit.fairseq_plugin.features.health import measure_health

    health = record["health"]
    assert health["floor"]["weights"]["count"] == 0 and not health["pairs_off"], health
    # what is left: every weight at 0.1 silences the encoder's gradient (through the decoder's two
    # 0.1-scaled cross-attention projections), which the block check and the encoder-silencing check flag
    assert [r.split(" ", 2)[1:2] for r in health["reasons"]] == [["encoder's"], ["blocks"]], health["reasons"]
    assert health["encoder_silencing"]["ratio"] >= 10
    quiet = {b["name"]: b["quieting"] for b in health["blocks"]}
    assert min(quiet["encoder.layers.0"], quiet["encoder.layers.1"]) > 100 > quiet["decoder.layers.1"]
    # measured on a GradInit batch of this run: LayerNorm gains before and after the clamped scales
    assert record["health"]["batch"]["sentences"] > 0 and record["health"]["norms"]
    assert all(n["gain_before"] > 0 and n["gain_after"] > 0 for n in record["health"]["norms"])
    assert measure_health(model, scales, None, None, initial=None, config=None)["verdict"] == "degenerate"
    cf = record["clamped_from"]
    assert cf["path"] == str(src) and len(cf["sha256"]) == 64 and cf["bounds"] == [["norm", 0.3, None], ["re:.", 0.1, None]]
    assert set(cf["changed"]) == {n for n in names if n.endswith("weight")}
    state = checkpoint_state(save / "checkpoint_last.pt")
    with torch.no_grad():
        for n, p in model.named_parameters():
            torch.testing.assert_close(state[n], p * want[n], rtol=0, atol=0), n
    # the written file is itself an init file giving the same start
    save2 = tmp_path / "ck2"
    train_inprocess(common + ["--save-dir", str(save2), "--gradinit-init-file", str(save / "gradinit.json")])
    state2 = checkpoint_state(save2 / "checkpoint_last.pt")
    assert all(torch.equal(state[k], state2[k]) for k in state if torch.is_floating_point(state[k]))


@pytest.mark.parametrize("extra,expected", [
    (["--gradinit-iters", "5", "--gradinit-init-clamp", LEVELS],
     "argument --gradinit-init-clamp: clamps the scales of --gradinit-init-file, and none is given"),
    (["--gradinit-init-file", "SRC", "--gradinit-init-clamp", "[('nrom', 0.3, None)]"],
     "argument --gradinit-init-clamp: \"[('nrom', 0.3, None)]\" is invalid: scale bound select='nrom'"),
])
def test_init_clamp_refused_at_parsing(extra, expected, tmp_path, capsys):
    from fairseq import options
    from fairseq_train import TINY_MODEL

    src = tmp_path / "s.json"
    src.write_text(json.dumps({"scales": {"encoder.layers.0.fc1.weight": 0.5}}))
    argv = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3"]
    argv += [str(src) if a == "SRC" else a for a in extra]
    with pytest.raises(SystemExit) as exc:
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {expected}" in err, err[-600:]


def test_max_step_ratio_floors_each_scale_so_the_sign_step_stays_a_fraction_of_the_tensor():
    from fairseq_gradinit.core import GradInit

    torch.manual_seed(0)
    model = PostLN()
    with torch.no_grad():
        model.fc1.weight.mul_(0.01)  # a small tensor: its floor is capped at 1
    eta, ratio = 1e-2, 0.5
    cfg = GradInitConfig(eta=eta, gamma=1e9, lr=0.5, iters=1, max_step_ratio=ratio,
                         scale_bounds=(("bias", 0, None),))
    engine = GradInit(model, lambda m, b: m(b).sum(), cfg)
    floors = dict(zip(engine.target.scaled.names, engine.target.scaled.min_scales.tolist()))
    rms = {n: p.detach().double().pow(2).mean().sqrt().item() for n, p in model.named_parameters()}
    assert floors["fc2.weight"] == pytest.approx(eta / (ratio * rms["fc2.weight"]), rel=1e-6)
    assert floors["fc1.weight"] == 1.0
    assert floors["layer_norm.weight"] == pytest.approx(max(0.01, eta / ratio), rel=1e-6)
    assert floors["fc1.bias"] == 0.0 and floors["fc2.bias"] == 0.0  # groups allowed to reach 0 keep 0
    # At the floor, the sign step is exactly `ratio` of the scaled tensor's rms.
    a = floors["fc2.weight"]
    step = eta * torch.ones_like(model.fc2.weight)
    assert (step.pow(2).mean().sqrt() / (a * model.fc2.weight.detach()).pow(2).mean().sqrt()).item() == \
        pytest.approx(ratio, rel=1e-5)
    with pytest.raises(ValueError, match="max_step_ratio"):
        GradInitConfig(optimizer="sgd", max_step_ratio=0.5)
    with pytest.raises(ValueError, match="max_step_ratio"):
        GradInitConfig(max_step_ratio=0)


@pytest.mark.parametrize("dropout", [False, True])
def test_dropout_option_runs_the_passes_in_train_mode_and_restores_the_flags(dropout):
    class Net(PostLN):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)
            self.seen = []

        def forward(self, x):
            self.seen.append(self.drop.training)
            return super().forward(self.drop(x))

    torch.manual_seed(0)
    model = Net().eval()
    data = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(2)]
    gradinit(model, data, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
             GradInitConfig(eta=0.1, gamma=1e9, iters=2, dropout=dropout))
    assert model.seen and set(model.seen) == {dropout}
    assert not model.training and not model.drop.training


def test_a_fingerprint_from_before_an_engine_setting_existed_matches_its_default_only():
    from fairseq_gradinit.fairseq_plugin.phase.provenance import fingerprint_diff

    current = {"gradinit": {"resolved": {"eta": 1e-3, "max_step_ratio": None, "dropout": False, "precision": "fp32"}}}
    old = {"gradinit": {"resolved": {"eta": 1e-3}}}
    assert fingerprint_diff(old, current, keys=("gradinit",)) == []
    changed = {"gradinit": {"resolved": dict(current["gradinit"]["resolved"], max_step_ratio=0.5)}}
    assert fingerprint_diff(old, changed, keys=("gradinit",)) == ["gradinit.resolved.max_step_ratio: <absent> -> 0.5"]
    # a setting the newer run lacks is a difference, as is an unknown one
    assert fingerprint_diff(current, old, keys=("gradinit",))
    assert fingerprint_diff(old, {"gradinit": {"resolved": {"eta": 1e-3, "new_thing": None}}}, keys=("gradinit",))


def test_study_cache_keys_ignore_later_settings_at_their_default():
    from lab.study.plan import group_key

    base = {"model": {"arch": "x"}, "seed": 1, "gradinit": {"resolved": {"eta": 1e-3}}}
    with_defaults = {**base, "gradinit": {"resolved": {"eta": 1e-3, "max_step_ratio": None, "dropout": False,
                                                       "unstepped_uses": None, "precision": "fp32"}}}
    assert group_key(with_defaults) == group_key(base)
    changed = {**base, "gradinit": {"resolved": {"eta": 1e-3, "dropout": True}}}
    assert group_key(changed) != group_key(base)
    # a setting that existed before keeps counting at its default
    assert group_key({**base, "gradinit": {"resolved": {"eta": 1e-3, "overlap": 0.5}}}) != group_key(base)
