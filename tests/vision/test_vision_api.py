"""fairseq_gradinit.vision: gradinit / metainit on registry models and torchvision models."""
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fairseq_gradinit.core import gradient_quotient
from fairseq_gradinit.core.metainit import higher_order_batch_norm
from fairseq_gradinit.vision import create_model, gradinit, list_models, metainit
from fairseq_gradinit.vision.api import DeviceLoader, to_device

ROOT = Path(__file__).resolve().parents[2]
slow = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow on CPU; set RUN_SLOW=1 to run")

SMALL_WIDTH = {"vgg19": 0.125, "wrn_28_10": 0.1, "resnet1202": 0.125}
SLOW_MODELS = {"resnet1202"}


def batches(n=3, size=4, channels=3, side=8, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, channels, side, side, generator=g), torch.randint(0, classes, (size,), generator=g))
            for _ in range(n)]


def norm_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def check_result(model, result, min_scale=0.01):
    assert result.scales
    assert all(v >= min_scale - 1e-7 and math.isfinite(v) for v in result.scales.values())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert result.num_skipped == 0


def test_import_does_not_import_fairseq_and_script_help():
    # One subprocess (importing torch dominates its cost): a fresh interpreter imports the vision
    # package and runs scripts/train_vision.py --help; fairseq must never be imported.
    code = (
        "import runpy, sys\n"
        "import fairseq_gradinit.vision, fairseq_gradinit.core\n"
        "def fs(): return sorted(m for m in sys.modules if m == 'fairseq' or m.startswith('fairseq.'))\n"
        "assert not fs(), fs()\n"
        f"sys.argv = [{str(ROOT / 'scripts' / 'train_vision.py')!r}, '--help']\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "assert not fs(), fs()\n"
        "print('NO-FAIRSEQ-OK')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert "NO-FAIRSEQ-OK" in out.stdout
    assert "--gradinit-lr" in out.stdout and "--limit-train-batches" in out.stdout


CASES = [(n, kw) for n in list_models()
         for kw in ([{"fixup_init": False}, {"fixup_init": True}] if n.startswith("fixup") else [{"bn": True}, {"bn": False}])]


@pytest.mark.parametrize("name,kwargs", [pytest.param(n, kw, marks=slow if n in SLOW_MODELS else ())
                                         for n, kw in CASES], ids=[f"{n}-{kw}" for n, kw in CASES])
def test_gradinit_on_registry_models(name, kwargs):
    torch.manual_seed(0)
    model = create_model(name, num_classes=5, width=SMALL_WIDTH.get(name, 0.25), **kwargs)
    model.train()
    stats = norm_state(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = gradinit(model, batches(3), iters=2, lr=0.05, progress=False)
    assert len(result.history) == 2
    check_result(model, result)
    assert model.training  # modes restored
    for k, v in norm_state(model).items():
        assert torch.equal(v, stats[k]), k  # BN running statistics untouched
    # the model holds alpha_i * W_i
    for n, s in result.scales.items():
        torch.testing.assert_close(dict(model.named_parameters())[n], before[n] * s, rtol=1e-5, atol=1e-7)
    if name.startswith("fixup"):
        scaled_scalars = [n for n in result.scales if n.endswith(".scale")]
        assert len(scaled_scalars) == 54  # FixUp's scalar multipliers get a scale too
        assert not any(".bias1a" in n for n in result.scales)  # zero biases are not scaled


def test_gradinit_one_pass_default_and_progress_bar():
    model = create_model("vgg19", width=0.0625, num_classes=5)
    result = gradinit(model, batches(4), progress=True)
    assert len(result.history) == 3  # one pass: N batches give N - 1 pairs (S, S~)
    check_result(model, result)
    one_shot = gradinit(create_model("vgg19", width=0.0625, num_classes=5), iter(batches(3)), progress=False)
    assert len(one_shot.history) == 2


def test_gradinit_objective_branch_and_options():
    model = create_model("vgg19", width=0.0625, num_classes=5)
    result = gradinit(model, batches(3), iters=2, gamma=1e6, min_scale=0.5, max_scale=1.5, lr=0.1,
                      optimizer="adam", eta=1e-3, overlap=1.0, progress=False)
    assert [r.branch for r in result.history] == ["objective", "objective"]
    assert all(0.5 - 1e-7 <= s <= 1.5 + 1e-7 for s in result.scales.values())
    cons = gradinit(create_model("vgg19", width=0.0625, num_classes=5), batches(3), iters=2, gamma=1e-9,
                    progress=False)
    assert [r.branch for r in cons.history] == ["constraint", "constraint"]
    assert result.config.betas == (0.9, 0.999) and result.config.sgd_step == "normalized"
    assert result.config.adam_state == "shared" and result.config.step_params == "all"
    # BatchNorm weights capped at 0.9 by a group bound, everything else in [0.5, 1.5]
    capped = gradinit(create_model("vgg19", width=0.0625, num_classes=5), batches(3), iters=2, gamma=1e6,
                      min_scale=0.5, max_scale=1.5, lr=0.5, optimizer="adam", eta=1e-3, progress=False,
                      scale_bounds=[("norm", None, 0.9)], step_params="scaled")
    bn = batch_norm_weight_names(create_model("vgg19", width=0.0625, num_classes=5))
    assert bn and bn <= set(capped.scales) and all(capped.scales[n] <= 0.9 + 1e-7 for n in bn)
    assert all(0.5 - 1e-7 <= v <= 1.5 + 1e-7 for v in capped.scales.values())


def batch_norm_weight_names(model):
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}


def test_param_filter_and_custom_loss_with_dict_batches():
    model = create_model("resnet110", width=0.125, num_classes=5)
    data = [{"image": x, "label": y} for x, y in batches(3)]
    seen = []

    def loss_fn(m, batch):
        seen.append(batch["image"].shape[0])
        return nn.functional.cross_entropy(m(batch["image"]), batch["label"])

    result = gradinit(model, data, iters=2, loss_fn=loss_fn, progress=False,
                      param_filter=lambda n, p: "bn" not in n and p.dim() > 1)
    assert seen and all(s == 4 for s in seen)
    assert result.scales and all("bn" not in n for n in result.scales)


def test_default_loss_rejects_unknown_batches():
    with pytest.raises(ValueError, match="input, target"):
        gradinit(create_model("vgg19", width=0.0625), [torch.randn(4, 3, 8, 8)] * 3, iters=1, progress=False)


def test_torchvision_resnet18():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tv.models.resnet18(num_classes=5)
    stats = norm_state(model)
    result = gradinit(model, batches(2, size=4, side=16), iters=1, lr=0.05, progress=False)
    check_result(model, result)
    assert any(n.startswith("layer4") for n in result.scales)
    for k, v in norm_state(model).items():
        assert torch.equal(v, stats[k]), k


@slow
def test_torchvision_resnet50_and_densenet121_constraint_pass():
    tv = pytest.importorskip("torchvision")
    for build in (tv.models.resnet50, tv.models.densenet121):
        torch.manual_seed(0)
        model = build(num_classes=5)
        stats = norm_state(model)
        result = gradinit(model, batches(2, size=2, side=32), iters=1, gamma=1e-9, progress=False)
        assert result.history[0].branch == "constraint"
        check_result(model, result)
        assert all(torch.equal(v, stats[k]) for k, v in norm_state(model).items())


def small_vit(classes=5):
    tv = pytest.importorskip("torchvision")
    model = tv.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                        mlp_dim=32, num_classes=classes)
    # torchvision zero-initializes the head, which makes every other gradient zero at the start
    nn.init.normal_(model.heads.head.weight, std=0.1)
    return model


def test_small_vit_with_layernorm():
    torch.manual_seed(0)
    model = small_vit()
    result = gradinit(model, batches(3, side=16), iters=2, lr=0.05, optimizer="adam", eta=1e-3, progress=False)
    check_result(model, result)
    assert any("ln" in n and n.endswith("weight") for n in result.scales)  # LayerNorm gains are scaled
    cons = gradinit(small_vit(), batches(3, side=16), iters=1, gamma=1e-9, progress=False)
    assert cons.history[0].branch == "constraint"  # double backward through attention and LayerNorm


def test_custom_scale_and_bias_parameters():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.gain = nn.Parameter(torch.full((1,), 2.0))
            self.shift = nn.Parameter(torch.full((4, 1, 1), 0.1))
            self.fc = nn.Linear(4, 5)

        def forward(self, x):
            h = torch.relu(self.conv(x) * self.gain + self.shift)
            return self.fc(h.mean((2, 3)))

    model = Net()
    result = gradinit(model, batches(3), iters=2, progress=False)
    assert {"gain", "shift", "conv.weight", "fc.weight"} <= set(result.scales)
    assert model.gain.item() == pytest.approx(2.0 * result.scales["gain"])


def test_dataparallel_wrapped_model():
    model = create_model("resnet110", width=0.125, num_classes=5)
    wrapped = nn.DataParallel(model)
    w0 = model.fc.weight.detach().clone()
    result = gradinit(wrapped, batches(3), iters=2, progress=False)
    assert "fc.weight" in result.scales and not any(n.startswith("module.") for n in result.scales)
    torch.testing.assert_close(model.fc.weight, w0 * result.scales["fc.weight"])


def test_ddp_wrapped_model(tmp_path):
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = create_model("vgg19", width=0.0625, num_classes=5)
        ddp = nn.parallel.DistributedDataParallel(model)
        stats = norm_state(model)
        result = gradinit(ddp, batches(3), iters=2, progress=False)
        check_result(model, result)
        assert result.world_size == 1
        assert all(torch.equal(v, stats[k]) for k, v in norm_state(model).items())
    finally:
        dist.destroy_process_group()


def test_device_handling():
    model = create_model("vgg19", width=0.0625)
    b = (torch.randn(2, 3, 8, 8), {"y": torch.zeros(2, dtype=torch.long)}, "meta")
    moved = to_device(b, torch.device("cpu"))
    assert moved[2] == "meta" and moved[1]["y"].device.type == "cpu"
    loader = DeviceLoader(batches(2), torch.device("cpu"))
    assert len(loader) == 2 and len(list(loader)) == 2 and len(list(loader)) == 2  # re-iterable
    with pytest.raises(ValueError, match="model's parameters are on cpu"):
        gradinit(model, batches(3), iters=1, device="cuda", progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batchnorm_and_attention_models():
    """cuDNN batch norm and CUDA's fused attention under both branches; batches move to the model's device."""
    torch.manual_seed(0)
    model = create_model("resnet110", bn=True, width=0.25).cuda()
    stats = norm_state(model)
    for gamma in (1e-9, 1e9):
        result = gradinit(model, batches(3), iters=2, gamma=gamma, lr=0.05, progress=False)
        check_result(model, result)
        assert {r.branch for r in result.history} == {"constraint" if gamma < 1 else "objective"}
    assert all(torch.equal(v, stats[k]) for k, v in norm_state(model).items())
    vit = small_vit().cuda()
    for gamma in (1e-9, 1e9):
        result = gradinit(vit, batches(3, side=16), iters=2, gamma=gamma, optimizer="adam", eta=1e-3,
                          lr=0.05, progress=False)
        check_result(vit, result)
    assert next(vit.parameters()).device.type == "cuda"


def test_gradient_quotient_of_a_quadratic():
    # L = a/2 * theta^2: g = a theta, Hg = a^2 theta, GQ = |(g - Hg)/g - 1| = a.
    theta = nn.Parameter(torch.tensor([1.5, -2.0]))
    for a in (0.5, 3.0):
        loss = 0.5 * a * (theta ** 2).sum()
        gq = gradient_quotient(loss, [theta], eps=1e-12)
        assert gq.item() == pytest.approx(a, rel=1e-5)
        assert gq.requires_grad


def test_higher_order_batch_norm_matches_and_restores():
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    bn.track_running_stats = False
    x = torch.randn(4, 3, 5, 5)
    ref = bn(x)
    with higher_order_batch_norm(bn):
        assert "forward" in bn.__dict__
        torch.testing.assert_close(bn(x), ref, rtol=1e-4, atol=1e-5)
    assert "forward" not in bn.__dict__


@pytest.mark.parametrize("name,kwargs", [("vgg19", {"bn": True}), ("vgg19", {"bn": False})])
def test_metainit_changes_norms(name, kwargs):
    torch.manual_seed(0)
    model = create_model(name, num_classes=5, width=SMALL_WIDTH.get(name, 0.125), **kwargs)
    stats = norm_state(model)
    result = metainit(model, batches(2, size=4), lr=0.1, iters=2, progress=False)
    assert len(result.history) == 2 and result.num_skipped == 0
    assert all(math.isfinite(r.gq) and r.gq >= 0 for r in result.history)
    assert all(s >= 0.01 - 1e-7 for s in result.scales.values())
    changed = [n for n in result.scales if abs(result.norms[n] - result.initial_norms[n]) > 1e-4 * result.initial_norms[n]]
    assert changed
    params = dict(model.named_parameters())
    for n in result.scales:
        assert params[n].norm().item() == pytest.approx(result.norms[n], rel=1e-4)
    assert all(torch.equal(v, stats[k]) for k, v in norm_state(model).items())
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.training


def test_metainit_one_pass_on_small_vit():
    model = small_vit()
    result = metainit(model, batches(2, side=16), progress=False)
    assert len(result.history) == 2 and result.num_skipped == 0


# -- a failed run leaves the model as it was given; clear messages ----------------------------------
def small_cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_unchanged(model, before):
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


@pytest.mark.parametrize("fn", [gradinit, metainit])
def test_all_nan_loader_is_an_error_and_leaves_the_model_as_given(fn):
    model = small_cnn()
    before = weights(model)
    nan = [(torch.full((4, 3, 8, 8), float("nan")), torch.zeros(4, dtype=torch.long)) for _ in range(3)]
    with pytest.warns(RuntimeWarning), pytest.raises(FloatingPointError, match="all 2 iterations were skipped"):
        fn(model, nan, iters=2, progress=False)
    assert_unchanged(model, before)


@pytest.mark.parametrize("fn", [gradinit, metainit])
def test_loader_raising_mid_run_leaves_the_model_as_given(fn):
    model = small_cnn()
    before = weights(model)

    def loader():
        yield from batches(4)
        raise OSError("disk read failed")

    with pytest.raises(OSError, match="disk read failed"):
        fn(model, loader(), lr=0.05, progress=False)
    assert_unchanged(model, before)


def test_uint8_images_get_a_message():
    model = small_cnn()
    before = weights(model)
    raw = [(torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
           for _ in range(3)]
    with pytest.raises(ValueError, match=r"uint8 images.*ToTensor\(\)"):
        gradinit(model, raw, iters=2, progress=False)
    assert_unchanged(model, before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fn", [gradinit, metainit])
def test_half_precision_models_are_refused(fn, dtype):
    model = small_cnn().to(dtype)
    with pytest.raises(ValueError, match=rf"'0.weight' is {dtype}.*Run GradInit before converting"):
        fn(model, [(x.to(dtype), y) for x, y in batches(3)], iters=2, progress=False)


def test_result_has_a_health_check():
    # BatchNorm net pushed to its floor: the tensors at their lower bound make it degenerate; the
    # BatchNorm layers are measured (input std, gain before/after) but not judged.
    model = create_model("vgg19", width=0.0625, num_classes=5)
    pushed = gradinit(model, batches(3), iters=2, gamma=1e-9, min_scale=0.5, lr=0.5, progress=False)
    health = pushed.health
    at_floor = [n for n, v in pushed.scales.items() if v <= 0.5 + 1e-6 and not n.endswith(".bias")]
    assert len(at_floor) > 1 and sorted(health.floor_weights) == sorted(at_floor)
    assert health.verdict == "degenerate" and "at their lower bound" in health.reasons[0]
    bn = batch_norm_weight_names(create_model("vgg19", width=0.0625, num_classes=5))
    assert {n.name + ".weight" for n in health.norms} == bn and {n.kind for n in health.norms} == {"batch_norm"}
    assert all(n.input_std_before > 0 and n.input_std_after > 0 for n in health.norms)
    assert pushed.to_dict()["health"]["verdict"] == "degenerate"
    # a short run of a LayerNorm model from a one-shot iterator: measured on its last batch, ok (gamma
    # from the gradient at the init, so that its objective iterations run)
    vit = gradinit(small_vit(), iter(batches(3, side=16)), lr=0.05, optimizer="adam", eta=1e-3, gamma_init_factor=2,
                   progress=False)
    assert len(vit.history) == 2 and vit.health.verdict == "ok", vit.health.reasons
    assert vit.health.phase.objective == 2 and all(b.quieting < 10 for b in vit.health.blocks)
    kinds = {n.kind for n in vit.health.norms}
    assert "layer_norm" in kinds and all(n.gain_before is not None for n in vit.health.norms)


@pytest.mark.parametrize("fn", [gradinit, metainit])
@pytest.mark.parametrize("iters", [None, 3])
@pytest.mark.parametrize("kind", ["empty", "spent"])
def test_a_loader_that_gives_no_iteration_is_an_error_not_scales_of_one(fn, iters, kind):
    # Work asked for and not done: no result of scales 1 with a healthy verdict, and the model as given.
    # (A loader whose length is known to be too short is refused before the run, by its length.)
    loader = iter(batches(3))
    if kind == "spent":
        list(loader)  # an iterator used up, e.g. by a first call
    else:
        loader = (b for b in ())
    model = small_cnn()
    before = weights(model)
    with pytest.raises(ValueError, match="the batches ran out before the first iteration"):
        fn(model, loader, iters=iters, progress=False)
    assert_unchanged(model, before)


def test_a_single_batch_gives_gradinit_no_pair_and_is_refused():
    # GradInit pairs consecutive batches: one batch of a loader without a length gives no iteration.
    with pytest.raises(ValueError, match="ran out before the first iteration.*at least 2"):
        gradinit(small_cnn(), (b for b in batches(1)), progress=False)
    assert metainit(small_cnn(), (b for b in batches(1)), progress=False).scales  # MetaInit needs one
    with pytest.raises(ValueError, match=r"the loader has 1 batch\(es\): GradInit pairs consecutive batches"):
        gradinit(small_cnn(), batches(1), progress=False)  # a length known too short: refused before the run


@pytest.mark.parametrize("fn", [gradinit, metainit])
def test_a_floor_above_one_is_refused(fn):
    with pytest.raises(ValueError, match=r"min_scale=2.0 is invalid: expected a number in \(0, 1\]"):
        fn(small_cnn(), batches(3), min_scale=2.0, progress=False)
    assert fn(small_cnn(), batches(3), min_scale=1.0, progress=False).scales  # 1 is a floor, not above it


def test_apply_scales_refuses_negative_and_zero_weight_scales_and_allows_zero_biases():
    from fairseq_gradinit.vision import apply_scales

    model = small_cnn()
    before = weights(model)
    for bad, words in [({"0.weight": -1.0}, "negative scales"), ({"3.weight": 0.0}, "scales of 0 on tensors that "
                                                                 "are not biases")]:
        with pytest.raises(ValueError, match=f"cannot apply these scales: 1 {words}, e.g. \\['{next(iter(bad))}'\\]"):
            apply_scales(model, {"0.bias": 0.5, **bad})
        assert_unchanged(model, before)  # refused before any tensor changed
    assert apply_scales(model, {"0.bias": 0.0, "3.weight": 0.5}) == ["0.bias", "3.weight"]
    assert not model[0].bias.detach().any() and torch.equal(model[3].weight.detach(), before["3.weight"] * 0.5)


def test_a_warning_names_the_keywords_of_the_python_call(caplog):
    """No objective iteration ran (gamma far below ||g||): the warning names gradinit()'s keywords, not the
    plugin's flags."""
    caplog.set_level(logging.WARNING, logger="fairseq_gradinit")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5))
    gradinit(model, batches(n=4), gamma=1e-9, iters=3, optimizer="adam", eta=1e-3, progress=True)
    advice = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gradinit: no objective iteration")]
    assert len(advice) == 1 and "(iters=...)" in advice[0] and "(gamma=...)" in advice[0]
    assert "--gradinit" not in caplog.text
