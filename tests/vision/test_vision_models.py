"""The CIFAR architectures of the GradInit paper: registry, parameter counts, forward/backward."""
import math
import os

import pytest
import torch
from torch import nn

from fairseq_gradinit.vision.models import create_model, list_models, register_model
from fairseq_gradinit.vision.models.registry import _MODELS

slow = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow on CPU; set RUN_SLOW=1 to run")

#: Parameter counts (millions) in the paper's Table 2 and Table 6 (Appendix).
PAPER_COUNTS = [
    ("vgg19", {"bn": False}, 20.03),
    ("vgg19", {"bn": True}, 20.04),
    ("resnet110", {"bn": False}, 1.72),
    ("resnet110", {"bn": True}, 1.73),
    ("resnet1202", {"bn": True}, 19.42),
    ("wrn_28_10", {"bn": True}, 36.49),
    ("densenet100", {"bn": False}, 0.75),
    ("densenet100", {"bn": True}, 0.77),
    ("fixup_resnet110", {}, 1.72),
]
PAPER_MODELS = {"vgg19", "resnet110", "resnet1202", "wrn_28_10", "densenet100", "fixup_resnet110"}

#: Reduced width for the forward/backward checks; resnet1202 (1200 layers) only with RUN_SLOW=1.
SMALL_WIDTH = {"vgg19": 0.125, "wrn_28_10": 0.1, "resnet1202": 0.125}
SLOW_MODELS = {"resnet1202"}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_registry_has_the_paper_models():
    assert PAPER_MODELS <= set(list_models())
    assert list_models() == sorted(list_models())
    assert list_models("resnet*") == ["resnet110", "resnet1202"]
    with pytest.raises(ValueError, match="unknown model 'nope'.*resnet110"):
        create_model("nope")


def test_register_model_decorator():
    @register_model(name="_test_tiny_net")
    def tiny(*, num_classes=10, in_channels=3):
        return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))

    try:
        assert "_test_tiny_net" in list_models()
        assert isinstance(create_model("_test_tiny_net", num_classes=3), nn.Sequential)
        with pytest.raises(ValueError, match="already registered"):
            register_model(lambda: None, name="_test_tiny_net")
    finally:
        _MODELS.pop("_test_tiny_net", None)


@pytest.mark.parametrize("name,kwargs,millions", PAPER_COUNTS,
                         ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in kw.items()) or 'default'}" for n, kw, _ in PAPER_COUNTS])
def test_parameter_count_matches_paper(name, kwargs, millions):
    model = create_model(name, **kwargs)
    assert round(n_params(model) / 1e6, 2) == millions


@pytest.mark.parametrize("name", ["vgg19", "resnet110", "densenet100"])
def test_bn_switch(name):
    with_bn = create_model(name, bn=True, width=0.25)
    without = create_model(name, bn=False, width=0.25)
    convs = [m for m in with_bn.modules() if isinstance(m, nn.Conv2d)]
    assert any(isinstance(m, nn.BatchNorm2d) for m in with_bn.modules())
    assert all(m.bias is None for m in convs)  # BN follows every convolution
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in without.modules())
    assert all(m.bias is not None for m in without.modules() if isinstance(m, nn.Conv2d))  # learnable biases


def test_kaiming_init():
    model = create_model("resnet110")
    conv = model.layer3[5].conv1  # 64 -> 64, 3x3: fan_out = 576
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2.0 / 576), rel=0.05)
    bn = model.layer3[5].bn1
    assert torch.all(bn.weight == 1) and torch.all(bn.bias == 0)
    assert torch.all(model.fc.bias == 0)
    nobn = create_model("resnet110", bn=False)
    assert torch.all(nobn.layer1[0].conv1.bias == 0)


def test_width_and_channels_options():
    small = create_model("resnet110", width=0.25, num_classes=7, in_channels=1)
    assert small.conv1.in_channels == 1 and small.conv1.out_channels == 4
    assert small.fc.out_features == 7 and small.fc.in_features == 16
    assert n_params(small) < n_params(create_model("resnet110")) / 10
    with pytest.raises(ValueError, match="width"):
        create_model("resnet110", width=0)
    with pytest.raises(ValueError, match="in_channels"):
        create_model("vgg19", in_channels=0)


def test_fixup_initialization():
    model = create_model("fixup_resnet110")
    blocks = [b for layer in (model.layer1, model.layer2, model.layer3) for b in layer]
    assert len(blocks) == 54
    assert all(torch.all(b.conv2.weight == 0) for b in blocks)
    assert torch.all(model.fc.weight == 0) and torch.all(model.fc.bias == 0)
    w = blocks[-1].conv1.weight
    fan_out = w.shape[0] * w.shape[2] * w.shape[3]
    expected = math.sqrt(2.0 / fan_out) / math.sqrt(54)
    assert blocks[-1].conv1.weight.std().item() == pytest.approx(expected, rel=0.05)
    assert all(b.scale.item() == 1.0 and b.bias1a.item() == 0.0 for b in blocks)
    # FixUp: the first step's gradient is zero everywhere except in the classifier (paper, App. A).
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    nn.functional.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        if name.startswith("fc.") or name == "bias2":
            continue
        assert torch.all(p.grad == 0), name
    assert model.fc.weight.grad.abs().sum() > 0 or model.fc.bias.grad.abs().sum() > 0

    kaiming = create_model("fixup_resnet110", fixup_init=False)
    assert kaiming.layer1[0].conv2.weight.abs().sum() > 0 and kaiming.fc.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="no BN"):
        create_model("fixup_resnet110", bn=True)


def _variants(name):
    return [{"bn": True}, {"bn": False}] if name not in ("fixup_resnet110",) else [{"fixup_init": False}]


CASES = [(name, kw) for name in list_models() for kw in _variants(name)]


@pytest.mark.parametrize("name,kwargs", [pytest.param(n, kw, marks=slow if n in SLOW_MODELS else ())
                                         for n, kw in CASES],
                         ids=[f"{n}-{kw}" for n, kw in CASES])
def test_forward_backward(name, kwargs):
    torch.manual_seed(0)
    in_ch = 1 if kwargs.get("bn", True) else 3
    model = create_model(name, num_classes=5, in_channels=in_ch, width=SMALL_WIDTH.get(name, 0.25), **kwargs)
    x = torch.randn(4, in_ch, 8, 8)
    out = model(x)
    assert out.shape == (4, 5)
    assert torch.isfinite(out).all()
    nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3])).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ["vgg19", "densenet100"])
def test_fashion_mnist_sized_inputs(name):
    model = create_model(name, in_channels=1, width=0.125)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
