"""Named recipes (the paper's and the authors' settings), the one derivation of eta and gamma from the
training learning rate, and the vision API's static signature built on them."""
import argparse
import math

import pytest
import torch
from torch import nn

from fairseq_gradinit.core import GradInitConfig
from fairseq_gradinit.core.config import first_step
from fairseq_gradinit.core.options import options_of, values_from
from fairseq_gradinit.command_line.option_forms import add_arguments
from fairseq_gradinit.core.recipes import Recipe, list_recipes, recipe

# The published numbers, written out here rather than read from the package: the paper's Appendix A and
# the authors' CIFAR launch script; the authors' IWSLT'14 launch script and fairseq code.
PAPER_CIFAR10 = dict(optimizer="sgd", eta=0.1, gamma=1.0, sgd_step="normalized", lr=0.01, betas=(0.9, 0.999),
                     iters=390, min_scale=0.01, overlap=0.5, scale_grad_clip=1.0)
AUTHORS_IWSLT14 = dict(optimizer="adam", eta=0.001, gamma=1000.0, lr=0.0025, betas=(0.9, 0.98), iters=780,
                       min_scale=0.01, overlap=0.5, adam_state="per_branch", step_params="all",
                       unstepped_uses="decoder\\.output_projection\\.")


def test_registry_names_its_recipes_and_refuses_an_unknown_one():
    assert list_recipes() == ("authors-iwslt14", "paper-cifar10")
    for name in list_recipes():
        r = recipe(name)
        assert isinstance(r, Recipe) and r.name == name and r.summary and r.source
    with pytest.raises(ValueError, match="'cifar'.*authors-iwslt14, paper-cifar10"):
        recipe("cifar")
    with pytest.raises(TypeError):
        recipe("paper-cifar10").values["eta"] = 1.0  # read-only


@pytest.mark.parametrize("name, expected, settings", [
    ("paper-cifar10", PAPER_CIFAR10, {"batch_size": 128}),
    ("authors-iwslt14", AUTHORS_IWSLT14, {"max_tokens": 6000}),
])
def test_recipes_hold_the_published_numbers(name, expected, settings):
    config = recipe(name).config()
    for field, value in expected.items():
        assert getattr(config, field) == value, field
    assert dict(recipe(name).settings) == settings
    # the rule of thumb the paper states holds for its own settings: eta*gamma^2 = 0.1 (SGD, CIFAR-10)
    if name == "paper-cifar10":
        assert config.eta * config.gamma ** 2 == pytest.approx(0.1)
    else:  # biases may reach 0, LayerNorm weights at most 100
        assert [b.to_list() for b in config.scale_bounds] == [["bias", 0, None], ["norm", None, 100]]


def test_recipe_config_takes_overrides_and_is_a_new_valid_config():
    r = recipe("paper-cifar10")
    a, b = r.config(), r.config(lr=0.05)
    assert a is not b and b.lr == 0.05 and a.lr == 0.01
    with pytest.raises(ValueError, match="GradInitConfig.eta"):
        r.config(eta=-1.0)


@pytest.mark.parametrize("name", ["paper-cifar10", "authors-iwslt14"])
def test_recipe_flags_parse_back_into_the_same_config(name):
    """The flags are what a command line of the front ends would parse into the recipe's config."""
    r = recipe(name)
    specs = options_of(GradInitConfig, python_only=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser, specs)
    for setting in r.settings:
        parser.add_argument("--gradinit-" + setting.replace("_", "-"), type=int)
    ns = parser.parse_args(list(r.flags()))
    assert GradInitConfig(**values_from(ns, specs, prefix="gradinit_")) == r.config()
    assert {s: getattr(ns, "gradinit_" + s) for s in r.settings} == dict(r.settings)


def test_first_step_derives_eta_and_gamma_by_each_rule():
    # the authors' IWSLT launch: Adam at lr 5e-4 -> eta 1e-3, gamma 1e3; the paper's SGD: lr 0.15 -> gamma 1
    assert first_step("adam", 5e-4, rule="fairseq") == pytest.approx((1e-3, 1e3))
    assert first_step("sgd", 0.15, rule="fairseq") == pytest.approx((0.15, 1.0))
    # the paper's rule of thumb: eta = lr, eta*gamma = 0.1 (Adam), eta*gamma^2 = 0.1 (SGD)
    assert first_step("sgd", 0.1) == pytest.approx((0.1, 1.0))
    assert first_step("adam", 1e-3) == pytest.approx((1e-3, 100.0))
    assert first_step("ADAM", None, eta=2e-3) == pytest.approx((2e-3, 50.0))
    # given values win; a factor leaves gamma to be measured; a bad eta derives nothing
    assert first_step("sgd", 0.1, eta=0.2, gamma=3.0) == (0.2, 3.0)
    assert first_step("adam", 1e-3, gamma_init_factor=2.0).gamma is None
    assert first_step("adam", -1.0).gamma is None
    with pytest.raises(ValueError, match="train_lr"):
        first_step("adam")
    with pytest.raises(ValueError, match="rule="):
        first_step("adam", 1e-3, rule="paper")
    with pytest.raises(ValueError, match="optimizer="):
        first_step("rmsprop", 1e-3)


def test_engine_gamma_is_the_rule_of_first_step():
    for opt, eta in (("adam", 1e-3), ("sgd", 0.1), ("sgd", 0.03)):
        expected = 0.1 / eta if opt == "adam" else math.sqrt(0.1 / eta)
        assert GradInitConfig(optimizer=opt, eta=eta).resolved_gamma == pytest.approx(expected)
    assert GradInitConfig(eta=1e-3, gamma_init_factor=2.0).resolved_gamma is None


def test_vision_defaults_are_the_cifar_recipe_with_one_pass():
    from fairseq_gradinit.vision.api import GRADINIT_OPTIONS

    cifar = recipe("paper-cifar10").values
    differ = {n for n, s in GRADINIT_OPTIONS.items() if n in cifar and s.default != cifar[n]}
    assert differ == {"iters", "gamma"}  # one pass over the loader; gamma None: the rule of thumb
    defaults = GradInitConfig(**{n: s.default for n, s in GRADINIT_OPTIONS.items()})
    assert defaults.resolved_gamma == pytest.approx(cifar["gamma"])
    assert GRADINIT_OPTIONS["iters"].default is None


def test_plugin_defaults_take_the_authors_bounds():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.settings.options import FAIRSEQ_DEFAULTS

    authors = recipe("authors-iwslt14").values
    assert FAIRSEQ_DEFAULTS["scale_bounds"].value == authors["scale_bounds"]
    assert FAIRSEQ_DEFAULTS["adam_state"].value == authors["adam_state"]


def _tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    batches = [(torch.randn(6, 4), torch.randint(0, 3, (6,))) for _ in range(4)]
    return model, batches


def test_vision_gradinit_takes_a_recipe_config():
    from fairseq_gradinit.vision import gradinit

    model, batches = _tiny()
    config = recipe("paper-cifar10").config(iters=3)
    result = gradinit(model, batches, config, progress=False)
    assert len(result.history) == 3 and result.config is config
    with pytest.raises(ValueError, match=r"config and the options \['eta'\].*dataclasses.replace"):
        gradinit(model, batches, config, eta=0.2, progress=False)
    with pytest.raises(TypeError, match="GradInitConfig"):
        gradinit(model, batches, {"iters": 3}, progress=False)
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "vision.md").read_text(encoding="utf-8")
    said = " ".join(page.split())
    assert ('`gradinit(model, loader, recipe("paper-cifar10").config(lr=5e-2))` with '
            '`from fairseq_gradinit.core.recipes import recipe`') in said
    assert recipe("paper-cifar10").config(lr=5e-2).lr == 5e-2


def test_the_python_api_page_states_the_recipes():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "python-api.md").read_text(encoding="utf-8")
    page = " ".join(page.split())
    assert f"`list_recipes()` gives `{list_recipes()!r}`" in page
    cifar, iwslt = recipe("paper-cifar10").config(), recipe("authors-iwslt14").config()
    assert (cifar.optimizer, cifar.eta, cifar.gamma, cifar.lr, cifar.iters, cifar.scale_grad_clip) == (
        "sgd", 0.1, 1.0, 1e-2, 390, 1.0)
    assert "(SGD, η = 0.1, γ = 1, τ = 1e-2, 390 iterations, the scale gradient clipped at 1)" in page
    assert (iwslt.optimizer, iwslt.eta, iwslt.gamma, iwslt.lr, iwslt.iters, iwslt.adam_state) == (
        "adam", 1e-3, 1e3, 2.5e-3, 780, "per_branch")
    assert "(Adam, η = 1e-3, γ = 1e3, τ = 2.5e-3, 780 iterations, per-branch moments," in page
    assert recipe("authors-iwslt14").settings["max_tokens"] == 6000 and "6000-token draws" in page
    assert recipe("paper-cifar10").settings["batch_size"] == 128 and "128-image batches" in page


def test_the_contributing_page_states_the_one_derivation():
    from pathlib import Path

    from fairseq_gradinit.core.config import ETA_PER_LR, LOSS_CHANGE_BOUNDS

    page = " ".join((Path(__file__).resolve().parents[2] / "docs" / "contributing.md").read_text(encoding="utf-8").split())
    assert set(ETA_PER_LR) == set(LOSS_CHANGE_BOUNDS) == {"engine", "fairseq"}
    assert ("Eta and gamma, when they are not given, come from one function for every front end, "
            "`first_step(optimizer, lr, rule=...)` in `core/config.py`") in page
