"""Each front end's defaults are a recipe plus a listed set of differences, ``field -> (value, reason)``:
the fairseq plugin's the authors' IWSLT'14 recipe, the vision API's and scripts/train_vision.py's the paper's
CIFAR-10 recipe. Checked field by field against the recipe's values (written out here) and the engine's."""
import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from fairseq_gradinit.core import GradInitConfig
from fairseq_gradinit.core.options import Default, options_of
from fairseq_gradinit.core.recipes import recipe

ENGINE = {s.name: s.default for s in options_of(GradInitConfig)}


def _expected(source, differences):
    """Field -> the value a front end built on ``source`` with ``differences`` must offer."""
    return {name: differences[name][0] if name in differences else source.values.get(name, default)
            for name, default in ENGINE.items()}


def _check_differences(source, differences, derived=()):
    """Every listed difference names a field or setting, states its reason and departs from the recipe
    (a value of None: derived when the run starts, ``derived`` those whose recipe value is also None)."""
    for name, (value, reason) in differences.items():
        assert name in ENGINE or name in source.settings, name
        assert isinstance(reason, str) and len(reason.split()) >= 4, name
        here = source.values.get(name, source.settings.get(name, ENGINE.get(name)))
        assert value != here or (value is None and name in derived), name


def test_the_plugins_defaults_are_the_authors_recipe_plus_the_listed_differences():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.settings.options import (
        ENGINE_OPTIONS,
        FAIRSEQ_DIFFERENCES,
        NO_WARMUP_GAMMA_INIT_FACTOR,
        NO_WARMUP_LOOKAHEAD_STEPS,
        NO_WARMUP_TAU,
        GradInitOptions,
    )
    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan

    authors = recipe("authors-iwslt14")
    assert set(FAIRSEQ_DIFFERENCES) == {"optimizer", "eta", "gamma", "gamma_init_factor", "lookahead_steps",
                                        "unstepped_uses", "lr", "iters", "log_interval", "max_tokens"}
    _check_differences(authors, FAIRSEQ_DIFFERENCES, derived=("gamma_init_factor",))
    expected = _expected(authors, FAIRSEQ_DIFFERENCES)
    offered = {s.name: s.default for s in ENGINE_OPTIONS}
    fields = {f.name: f.default for f in dataclasses.fields(GradInitOptions)}
    for spec in ENGINE_OPTIONS:
        assert offered[spec.name] == expected[spec.name], spec.name
        assert spec.parse(fields["gradinit_" + spec.name]) == spec.parse(spec.to_text(expected[spec.name])), spec.name
    assert fields["gradinit_max_tokens"] == FAIRSEQ_DIFFERENCES["max_tokens"][0] is None
    # the recipe's values the plugin keeps, checked against the published numbers
    assert (offered["adam_state"], offered["step_params"], offered["betas"], offered["min_scale"],
            offered["overlap"]) == ("per_branch", "all", (0.9, 0.98), 0.01, 0.5)
    assert [tuple(b) for b in offered["scale_bounds"]] == [("bias", 0, None), ("norm", None, 100)]
    # what the derived (None) differences resolve to at the authors' lr 5e-4 with Adam: their eta, and the
    # no-warmup setting in place of their gamma, tau and single un-stepped step
    plan = build_plan(GradInitOptions(gradinit_iters=780, gradinit_train_lr=[5e-4], gradinit_train_max_tokens=4096,
                                      gradinit_train_optimizer="adam"))
    assert plan.config == authors.config(gamma=None, gamma_init_factor=NO_WARMUP_GAMMA_INIT_FACTOR,
                                         lookahead_steps=NO_WARMUP_LOOKAHEAD_STEPS, unstepped_uses=None,
                                         lr=NO_WARMUP_TAU, log_interval=20)
    assert plan.max_tokens == 6144 != authors.settings["max_tokens"]


def test_the_vision_defaults_are_the_cifar_recipe_plus_the_listed_differences():
    from fairseq_gradinit.vision import gradinit
    from fairseq_gradinit.vision.api import GRADINIT_OPTIONS, VISION_DIFFERENCES

    cifar = recipe("paper-cifar10")
    assert set(VISION_DIFFERENCES) == {"iters", "gamma", "batch_size"}
    _check_differences(cifar, VISION_DIFFERENCES)
    expected = _expected(cifar, VISION_DIFFERENCES)
    params = inspect.signature(gradinit).parameters
    for name, spec in GRADINIT_OPTIONS.items():
        assert spec.default == expected[name] == params[name].default, name
    assert (expected["optimizer"], expected["eta"], expected["lr"], expected["betas"], expected["sgd_step"],
            expected["scale_grad_clip"]) == ("sgd", 0.1, 1e-2, (0.9, 0.999), "normalized", 1.0)
    defaults = GradInitConfig(**{n: s.default for n, s in GRADINIT_OPTIONS.items()})
    assert defaults == cifar.config(iters=None, gamma=None)
    assert defaults.resolved_gamma == pytest.approx(cifar.values["gamma"])  # the rule of thumb gives the recipe's


def test_train_visions_defaults_are_the_cifar_recipe_plus_the_listed_differences():
    from fairseq_gradinit.tools.train_vision.initialization import GRADINIT_CLI_OPTIONS, TRAIN_VISION_DIFFERENCES
    from fairseq_gradinit.vision.api import VISION_DIFFERENCES

    cifar = recipe("paper-cifar10")
    assert set(TRAIN_VISION_DIFFERENCES) == set(VISION_DIFFERENCES) | {"eta", "lr"}
    _check_differences(cifar, TRAIN_VISION_DIFFERENCES)
    expected = _expected(cifar, TRAIN_VISION_DIFFERENCES)
    for spec in GRADINIT_CLI_OPTIONS:
        assert spec.default == expected[spec.name], spec.name
    assert {s.name: s.default for s in GRADINIT_CLI_OPTIONS}["scale_grad_clip"] == cifar.values["scale_grad_clip"]


def test_recipe_defaults_keep_the_engines_declarations_and_refuse_what_is_not_a_difference():
    r = recipe("paper-cifar10")
    out = r.defaults({"iters": (None, "one pass over the loader")})
    # a recipe value at the engine's default (min_scale 0.01, overlap 0.5) keeps the engine's declaration
    assert set(out) == {n for n, v in r.values.items() if v != ENGINE[n]} | {"iters"}
    assert out["iters"] == Default(None) and out["eta"] == Default(0.1)
    with_text = r.defaults({}, texts={"overlap": "half of S"}, main=("pairs",))
    assert with_text["overlap"] == Default(0.5, "half of S")
    assert with_text["pairs"] == Default("overlap", experimental=False)
    with pytest.raises(ValueError, match=r"unknown fields \['etta'\].*batch_size"):
        r.defaults({"etta": (1.0, "a typo is not a difference")})
    with pytest.raises(ValueError, match=r"difference iters=None .*\(value, reason\)"):
        r.defaults({"iters": None})
    with pytest.raises(ValueError, match=r"difference iters=\(None, ''\)"):
        r.defaults({"iters": (None, "")})
    with pytest.raises(ValueError, match=r"texts for options the front end does not have: \['etta'\]"):
        r.defaults({}, texts={"etta": "0.1"})
    assert r.front_end_values({"batch_size": (None, "the loader's batches")})["batch_size"] is None


def test_the_engines_defaults_are_the_authors_recipe_plus_the_listed_differences():
    """``GradInitConfig()`` holds the authors' IWSLT'14 values field by field, except the fields
    ``AUTHORS_DIFFERENCES`` lists with a reason, each of which departs from the recipe."""
    from fairseq_gradinit.core.config import AUTHORS_DIFFERENCES

    authors = recipe("authors-iwslt14")
    engine = GradInitConfig()
    assert set(AUTHORS_DIFFERENCES) == {"gamma", "adam_state", "scale_bounds", "unstepped_uses"}
    for name, reason in AUTHORS_DIFFERENCES.items():
        assert len(reason.split()) >= 4, name
    for name in authors.values:
        ours, theirs = getattr(engine, name), getattr(authors.config(), name)
        if name in AUTHORS_DIFFERENCES:
            assert ours != theirs, name
        else:
            assert ours == theirs and type(ours) is type(theirs), name
    assert engine == authors.config(**{name: ENGINE[name] for name in AUTHORS_DIFFERENCES})
    # docs/contributing.md names the same differences
    page = " ".join((Path(__file__).resolve().parents[2] / "docs" / "contributing.md").read_text(encoding="utf-8").split())
    said = re.search(r"The engine's own defaults, those of `GradInitConfig\(\)`, are the `authors-iwslt14` recipe's "
                     r"values \(written once, in `fairseq_gradinit/core/recipe_values.py`\) except (.*?), which", page)
    assert said and set(re.findall(r"`(\w+)`", said.group(1))) == set(AUTHORS_DIFFERENCES)
    # the published numbers, written out here as the independent reference
    assert (engine.optimizer, engine.eta, engine.lr, engine.betas, engine.iters, engine.min_scale, engine.overlap,
            engine.step_params) == ("adam", 1e-3, 2.5e-3, (0.9, 0.98), 780, 0.01, 0.5, "all")


def test_the_engines_recipe_defaults_are_written_once():
    """The defaults of the recipe's fields are read from the recipe's values in ``core/config.py``, not
    restated there as literals (a changed recipe value cannot leave the engine's behind)."""
    from fairseq_gradinit.core import config
    from fairseq_gradinit.core.config import AUTHORS_DIFFERENCES

    tree = ast.parse(Path(config.__file__).read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GradInitConfig")
    defaults = {n.target.id: n.value.args[0] for n in cls.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Call) and n.value.args}
    shared = set(recipe("authors-iwslt14").values) - set(AUTHORS_DIFFERENCES)
    assert shared <= set(defaults)
    literal = sorted(name for name in shared if isinstance(defaults[name], (ast.Constant, ast.Tuple)))
    assert literal == [], f"defaults restating the recipe's values: {literal}"
