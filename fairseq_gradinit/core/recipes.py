"""Named GradInit recipes: the settings of the paper and of the authors' code, each declared once.

A recipe is a documented set of :class:`~.config.GradInitConfig` values plus the settings it implies
outside the config (batch sizes of a front end), looked up by name as timm looks up its models::

    from fairseq_gradinit.core.recipes import list_recipes, recipe

    list_recipes()                                   # ('authors-iwslt14', 'paper-cifar10')
    config = recipe("paper-cifar10").config(lr=5e-2)  # a GradInitConfig, with tau replaced
    recipe("authors-iwslt14").flags()                # the same settings as --gradinit-* flags

The front ends' own defaults come from here too: each is a recipe plus a documented list of
differences, ``field -> (value, reason)``, turned into the front end's defaults by
:meth:`Recipe.defaults` (the vision API's: the CIFAR-10 recipe,
:data:`fairseq_gradinit.vision.api.VISION_DIFFERENCES`; the fairseq plugin's: the authors' IWSLT
recipe, :data:`fairseq_gradinit.fairseq_plugin.settings.options.FAIRSEQ_DIFFERENCES`). Eta and gamma,
where a front end derives them, come from one function, :func:`~.config.first_step`.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .config import GradInitConfig
from .options import Default, options_of
from .recipe_values import AUTHORS_IWSLT14, AUTHORS_IWSLT14_SETTINGS, PAPER_CIFAR10, PAPER_CIFAR10_SETTINGS

#: A front end's departure from its recipe: the value it uses instead (None: derived when the run
#: starts) and why.
Difference = Tuple[Any, str]


@dataclass(frozen=True)
class Recipe:
    """A named GradInit setting: ``values`` are :class:`GradInitConfig` fields (the others keep the
    engine's defaults), ``settings`` what it implies outside the config, by the front-end option
    name without its ``--gradinit-`` prefix (e.g. ``max_tokens``, ``batch_size``)."""

    name: str
    summary: str
    source: str
    values: Mapping[str, Any]
    settings: Mapping[str, Any]

    def config(self, **overrides: Any) -> GradInitConfig:
        """A new :class:`GradInitConfig` with the recipe's values and ``overrides`` (field names)."""
        return GradInitConfig(**{**self.values, **overrides})

    def flags(self, prefix: str = "--gradinit-") -> Tuple[str, ...]:
        """The recipe as command-line arguments: its config values in declaration order, then its
        settings (``("--gradinit-eta", "0.001", ...)``)."""
        out = []
        for spec in options_of(GradInitConfig, python_only=False):
            if spec.name in self.values:
                out += [spec.flag(prefix), spec.to_text(self.values[spec.name])]
        for name, value in self.settings.items():
            out += [prefix + name.replace("_", "-"), str(value)]
        return tuple(out)

    def front_end_values(self, differences: Mapping[str, Difference]) -> Dict[str, Any]:
        """Every :class:`GradInitConfig` field and setting of a front end that starts from this recipe
        and departs from it where ``differences`` says: the difference's value, else the recipe's, else
        the engine's default (settings: the recipe's ones only)."""
        fields = {spec.name: spec.default for spec in options_of(GradInitConfig)}
        unknown = sorted(set(differences) - set(fields) - set(self.settings))
        if unknown:
            raise ValueError(f"differences from recipe {self.name!r} name unknown fields {unknown}: expected "
                             "GradInitConfig fields or the recipe's settings "
                             f"({', '.join(self.settings) or 'none'})")
        for name, difference in differences.items():
            if not (isinstance(difference, tuple) and len(difference) == 2 and isinstance(difference[1], str)
                    and difference[1].strip()):
                raise ValueError(f"difference {name}={difference!r} from recipe {self.name!r}: expected "
                                 "(value, reason) with the reason stated")
        out = {**fields, **self.values, **self.settings}
        out.update({name: value for name, (value, _) in differences.items()})
        return out

    def defaults(self, differences: Mapping[str, Difference], *, texts: Optional[Mapping[str, str]] = None,
                 main: Tuple[str, ...] = ()) -> Dict[str, Default]:
        """A front end's defaults (for :func:`~.options.options_of`) where they differ from the engine's:
        this recipe with ``differences`` (``field -> (value, reason)``) applied. ``texts``: how an option's
        help states its default (a derived one, None, says how it is derived); ``main``: research settings
        the front end lists with its main options. A field at the engine's own default, without a text,
        keeps the engine's declaration; the recipe's settings are the front end's own options."""
        texts = dict(texts or {})
        engine = {spec.name: spec.default for spec in options_of(GradInitConfig)}
        values = self.front_end_values(differences)
        out = {}
        for name, default in engine.items():
            value = values[name]
            if value == default and name not in texts and name not in main and type(value) is type(default):
                continue
            out[name] = Default(value, texts.pop(name, ""), experimental=False if name in main else None)
        if texts:
            raise ValueError(f"texts for options the front end does not have: {sorted(texts)}")
        return out


def _recipe(name: str, summary: str, source: str, values: Dict[str, Any], settings: Dict[str, Any]) -> Recipe:
    return Recipe(name, summary, source, types.MappingProxyType(values), types.MappingProxyType(settings))


#: The recipes by name (read them with :func:`recipe` and :func:`list_recipes`); their values, with where
#: each comes from, are in :mod:`.recipe_values`.
RECIPES: Mapping[str, Recipe] = types.MappingProxyType({r.name: r for r in (
    _recipe("paper-cifar10", "CIFAR-10 classifiers trained with SGD at learning rate 0.1 (the paper's vision setting)",
            "GradInit paper, Appendix A; zhuchen03/gradinit launch/run_gradinit.sh",
            dict(PAPER_CIFAR10), dict(PAPER_CIFAR10_SETTINGS)),
    _recipe("authors-iwslt14", "Post-LN Transformer on IWSLT'14 De-En trained with Adam at lr 5e-4 (the authors' "
                               "fairseq launch)",
            "GradInit paper, Appendix; zhuchen03/gradinit fairseq/gradinit/launch/run_iwslt_14_gradinit_no_clipping.sh "
            "and fairseq/gradinit/train.py",
            dict(AUTHORS_IWSLT14), dict(AUTHORS_IWSLT14_SETTINGS)),
)})


def list_recipes() -> Tuple[str, ...]:
    """The names of the recipes, sorted."""
    return tuple(sorted(RECIPES))


def recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``ValueError`` names the known ones."""
    try:
        return RECIPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown GradInit recipe {name!r}: expected one of {', '.join(list_recipes())} "
                         "(fairseq_gradinit.core.recipes.list_recipes())") from None
