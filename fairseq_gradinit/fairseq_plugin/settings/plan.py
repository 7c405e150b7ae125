"""A run's GradInit settings, resolved once: :class:`GradInitPlan`.

Every ``--gradinit-*`` option and every global setting the plugin reads (``--lr``, ``--max-tokens``,
``--save-dir``, ``--seed``, ...) is resolved here, from the task config of ``fairseq-train`` (whose
``${...}`` interpolations carry the globals, :class:`~.options.PluginOptions`) or from a parsed
``fairseq-train`` namespace (whose attributes :data:`~.options.GLOBAL_SETTINGS` names, read off the
same interpolations). Both go through :func:`build_plan`; the check when the command line is parsed,
the task's model checks, the cuDNN attention guard, the monitor, the run log, the batches, the checks
before the phase, the fingerprint and the phase all read the plan.

This module translates fairseq's config into the plan: it is one of the few that read a config itself.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
from collections import OrderedDict
from typing import Any, Mapping, Optional, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from ...core import GradInitConfig
from .init_file import read_init_file
from .option_values import (
    derived_options,
    gradinit_batch_tokens,
    gradinit_config_from_task,
    gradinit_enabled,
    training_optimizer,
)
from .options import GLOBAL_SETTINGS, GradInitOptions
from .validation import as_argument_error, check_when_parsed, first_error

#: Every field the plugin reads from a task config: the options and the global settings.
SETTING_NAMES = tuple(f.name for f in dataclasses.fields(GradInitOptions) if f.name.startswith("gradinit_"))


@dataclasses.dataclass(frozen=True)
class GradInitPlan:
    """What one run of the plugin does, resolved once.

    ``settings`` holds every ``gradinit_*`` field (fairseq's globals included, unresolvable ones as
    None) and is read like the task config: ``plan.gradinit_iters``. ``config`` is the resolved
    engine configuration (eta from ``--lr``, gamma from eta, ...), None when it does not resolve;
    ``error`` the first setting the run refuses, worded as argparse words its errors, or None.
    """

    settings: Mapping[str, Any]
    config: Optional[GradInitConfig]
    #: Why ``config`` is None (e.g. GradInit off and ``--lr 0``: nothing to resolve).
    config_error: Optional[str]
    #: Tokens drawn per GradInit iteration (None: neither ``--gradinit-max-tokens`` nor ``--max-tokens``).
    max_tokens: Optional[int]
    #: The options derived from the training command because they were not given.
    derived: Tuple[str, ...]
    error: Optional[str]
    #: Whether GradInit runs or applies saved scales (``--gradinit-iters`` > 0 or an init file).
    enabled: bool = False
    #: Whether GradInit computes scales (``--gradinit-iters`` > 0 and no init file).
    computes: bool = False
    #: The ``--gradinit-init-file`` as read (its ``gradinit.json``), None without one or where it cannot be
    #: read (``error`` says why): the phase applies these scales, read once.
    init_record: Optional[Mapping[str, Any]] = None
    #: The first refusal of the engine's options (:func:`~.option_values.gradinit_config_from_task`, ``--lr``
    #: only where GradInit computes) and of the init file, as argparse words its errors: what the
    #: ``settings`` checks report, found while the plan is resolved.
    option_errors: Tuple[str, ...] = ()

    def __getattr__(self, name: str):
        if name.startswith("gradinit_") and name in SETTING_NAMES:
            return self.__dict__["settings"][name]
        raise AttributeError(name)

    def setting(self, name: str, default=None):
        """The setting ``name`` (a ``gradinit_*`` field), or ``default`` where it is unset (None)."""
        value = self.__dict__["settings"][name]
        return default if value is None else value

    @property
    def init_file(self) -> Optional[str]:
        return self.settings["gradinit_init_file"] or None

    @property
    def init_clamp(self) -> Optional[str]:
        return self.settings["gradinit_init_clamp"] or None

    @property
    def save_dir(self) -> str:
        return self.settings["gradinit_save_dir"] or "checkpoints"

    @property
    def seed(self) -> int:
        return int(self.settings["gradinit_seed"] or 1)

    @property
    def tied_embeddings(self) -> str:
        return str(self.settings["gradinit_tied_embeddings"] or "shared")

    @property
    def checkpoint_interval(self) -> int:
        return int(self.settings["gradinit_checkpoint_interval"] or 0)

    @property
    def monitor_interval(self) -> int:
        """``--gradinit-monitor-interval`` (0: monitor off; also for a value that is not an integer)."""
        value = self.settings["gradinit_monitor_interval"]
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def valid_dropout_loss(self) -> bool:
        """``--gradinit-valid-dropout-loss``: validation also scored with dropout on."""
        return self.settings["gradinit_valid_dropout_loss"] is True

    @property
    def source_contrast(self) -> float:
        """``--gradinit-source-contrast``: the weight of the source contrast in GradInit's objective (0: off)."""
        return float(self.settings.get("gradinit_source_contrast") or 0.0)

    @property
    def source_gap(self) -> bool:
        """``--gradinit-source-gap``: validation also scored with rolled sources (auto and on: yes)."""
        return self.settings.get("gradinit_source_gap", "auto") != "off"

    @property
    def train_subset(self) -> Optional[str]:
        return self.settings["gradinit_train_subset"]

    @property
    def train_batch_size(self) -> Optional[int]:
        return self.settings["gradinit_train_batch_size"]

    def device(self):
        """Where the phase runs: this machine's current GPU unless there is none or ``--cpu``."""
        import torch

        if torch.cuda.is_available() and not self.settings["gradinit_cpu"]:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def plugin_settings(source) -> Mapping[str, Any]:
    """Every ``gradinit_*`` field of a task config, or of a parsed ``fairseq-train`` namespace (its
    global settings from the attributes :data:`~.options.GLOBAL_SETTINGS` names), read-only."""
    namespace = isinstance(source, argparse.Namespace)
    out = {}
    for name in SETTING_NAMES:
        try:
            value = getattr(source, GLOBAL_SETTINGS[name] if namespace and name in GLOBAL_SETTINGS else name)
        except Exception:  # absent, or an interpolation omegaconf cannot resolve (a config built outside fairseq)
            value = None
        if isinstance(value, (DictConfig, ListConfig)):  # plain values: the plan holds no live config node
            value = OmegaConf.to_container(value, resolve=True)
        out[name] = None if isinstance(value, str) and value.startswith("${") else value
    # fairseq fills --max-tokens-valid from --max-tokens only after the command line is parsed: the
    # same rule here, so that the parse's plan and the task's are one
    if out.get("gradinit_max_tokens_valid") is None:
        out["gradinit_max_tokens_valid"] = out.get("gradinit_train_max_tokens")
    if not namespace and out["gradinit_train_optimizer"] is None:
        out["gradinit_train_optimizer"] = training_optimizer(source)
    return types.MappingProxyType(out)


def build_plan(source) -> GradInitPlan:
    """The plan of the run a task config or a parsed namespace describes (never raises for bad
    settings: ``plan.error`` says what is wrong). Which checkpoint ``fairseq-train`` will restore is
    not a setting but a fact of the save dir when the run starts: :func:`~.restore.restore_source`
    of the plan.

    Resolved once per run: the plan is cached by the settings it came from (and the init file they
    name, as it is on disk), so that the check when the command line is parsed, the task and the
    fingerprint of one run get the same object."""
    settings = plugin_settings(source)
    key = _plan_key(settings)
    plan = _PLANS.pop(key, None)
    if plan is None:
        plan = _resolve(settings)
    _PLANS[key] = plan  # the most recent last
    while len(_PLANS) > _CACHED_PLANS:
        del _PLANS[next(iter(_PLANS))]
    return plan


#: Plans resolved in this process, by :func:`_plan_key` (a few: one per run, the latest kept).
_PLANS: "OrderedDict[str, GradInitPlan]" = OrderedDict()
_CACHED_PLANS = 8


def _plan_key(settings: Mapping[str, Any]) -> str:
    """What a plan depends on: the settings, and the init file's identity on disk (a file written
    again between two runs of one process is read again)."""
    path = settings["gradinit_init_file"]
    try:
        stat = os.stat(path) if path else None
        disk = None if stat is None else (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    except (OSError, TypeError, ValueError):
        disk = "unreadable"
    return json.dumps([dict(settings), disk], default=str, sort_keys=True)


def _resolve(settings: Mapping[str, Any]) -> GradInitPlan:
    """The plan of ``settings``: the engine's config derived and the init file read, once each; the
    ``settings`` checks (:mod:`.validation`) then read the plan."""
    view = types.SimpleNamespace(**settings)
    iters = view.gradinit_iters
    computes = isinstance(iters, int) and not isinstance(iters, bool) and iters > 0 and not view.gradinit_init_file
    option_errors = []
    try:
        config, config_error = gradinit_config_from_task(view), None
    except ValueError as e:
        config, config_error, refusal = None, str(e), e
        if not (isinstance(iters, int) and iters > 0):  # --lr matters only when GradInit computes
            try:
                gradinit_config_from_task(view, lr_matters=False)
                refusal = None
            except ValueError as other:
                refusal = other
        if refusal is not None:
            option_errors.append(as_argument_error(refusal, eta_from_lr=view.gradinit_eta is None))
    init_record = None
    if view.gradinit_init_file:
        try:
            init_record = types.MappingProxyType(read_init_file(view.gradinit_init_file))
        except ValueError as e:
            option_errors.append(as_argument_error(e, eta_from_lr=False))
    plan = GradInitPlan(settings=types.MappingProxyType(dict(settings)), config=config, config_error=config_error,
                        max_tokens=gradinit_batch_tokens(view), derived=tuple(derived_options(view)), error=None,
                        enabled=gradinit_enabled(view), computes=computes, init_record=init_record,
                        option_errors=tuple(option_errors))
    return dataclasses.replace(plan, error=first_error("settings", plan))


def namespace_error(ns) -> Optional[str]:
    """What the parser refuses in a parsed ``fairseq-train`` namespace's plan: the ``--gradinit-*``
    options and the settings GradInit cannot run with (:attr:`GradInitPlan.error`), then the training
    setup fairseq would trip over after the phase (the ``training setup`` checks, which the task runs
    again before the phase for configs not parsed from a command line), or None."""
    if not hasattr(ns, "gradinit_iters"):
        return None
    plan = build_plan(ns)
    return plan.error or first_error("training setup", plan)


def parse_error(ns) -> Optional[str]:
    """What the parser of a task the plugin serves refuses in a parsed namespace, or None: the
    checks of :mod:`.validation` in their order, ``arguments`` (the plugin's models and optimizers,
    :func:`~.validation.check_every_parse`), then ``settings`` and ``training setup``
    (:func:`namespace_error`)."""
    return first_error("arguments", ns) or namespace_error(ns)


def refuse_bad_values_when_parsed(parser) -> None:
    """Make ``parser`` refuse what :func:`parse_error` finds the way it refuses its own arguments
    (the ranges depend on each other and on --lr, so they are checked after the parse)."""
    check_when_parsed(parser, parse_error)
