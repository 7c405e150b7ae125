"""The ``--gradinit-*`` options as a core :class:`GradInitConfig`: what the plugin derives from the
training command (eta from ``--lr``, the optimizer, gamma, tokens per iteration). Their checks are
:mod:`.validation`'s.

These functions translate fairseq's config (or a parsed namespace) into the plan's values, so they read
it as it comes (:func:`~..data.cfg.cfg_value`); consumers read the plan."""
from typing import Optional

from ...core import GradInitConfig
from ...core.config import first_step
from ...core.errors import OptionValueError
from ...core.options import parse_scale_bounds, values_from  # noqa: F401  (parse_scale_bounds: re-exported)
from ..data.cfg import cfg_value
from .init_file import read_init_file  # noqa: F401  (re-exported)
from .options import ENGINE_OPTIONS, NO_WARMUP_GAMMA_INIT_FACTOR, NO_WARMUP_TAU, default_lookahead_steps


def gradinit_config_from_task(cfg, *, lr_matters: bool = True) -> GradInitConfig:
    """Translate the task's ``--gradinit-*`` options into a core :class:`GradInitConfig`, deriving
    what the plugin derives from the training command (see :data:`~.options.FAIRSEQ_DEFAULTS`).
    ``lr_matters=False``: an eta not given is the engine's default instead of one derived from ``--lr``
    (to check the other options where GradInit does not compute)."""
    values = values_from(cfg, ENGINE_OPTIONS, prefix="gradinit_")
    if values["eta"] is None and not lr_matters:
        values["eta"] = GradInitConfig.eta
    if values["optimizer"] is None:
        values["optimizer"] = "sgd" if training_optimizer(cfg) in ("sgd", "nag") else "adam"
    opt = str(values["optimizer"])
    adam = opt == "adam"
    if values["lookahead_steps"] is None:
        values["lookahead_steps"] = default_lookahead_steps(adam=adam, unstepped_uses=values["unstepped_uses"])
    if adam and values["gamma"] is None and values["gamma_init_factor"] is None:
        values["gamma_init_factor"] = NO_WARMUP_GAMMA_INIT_FACTOR
    if values["lr"] is None:
        values["lr"] = NO_WARMUP_TAU if adam else GradInitConfig.lr
    lr = None
    if values["eta"] is None:
        lr = cfg_value(cfg, "gradinit_train_lr")
        if lr is None:
            raise OptionValueError("--gradinit-eta", "is not set and the training --lr is unknown; pass --gradinit-eta")
        lr = float(lr[0] if isinstance(lr, (list, tuple)) or hasattr(lr, "__getitem__") else lr)
    values["eta"], values["gamma"] = first_step(opt, lr, eta=values["eta"], gamma=values["gamma"],
                                                gamma_init_factor=values["gamma_init_factor"], rule="fairseq")
    return GradInitConfig(**values)


def training_optimizer(cfg) -> Optional[str]:
    """The name of the run's ``--optimizer``, or None where the config does not tell."""
    name = cfg_value(cfg, "gradinit_train_optimizer")
    if name is None and hasattr(cfg, "_get_root"):
        # fairseq keeps optimizers declared with add_args (sgd, nag) as an argparse Namespace in the
        # config, where the ${oc.select:optimizer._name} interpolation finds nothing: read the node.
        try:
            node = cfg._get_root().get("optimizer", None)
        except Exception:  # a task config built outside fairseq-train has no such root
            node = None
        name = getattr(node, "_name", None) or (node.get("_name", None) if hasattr(node, "get") else None)
    return None if name is None else str(name)


def derived_options(cfg) -> list:
    """The options whose value :func:`gradinit_config_from_task` / :func:`gradinit_batch_tokens`
    derive from the training command because they were not given (``optimizer``, ``eta``,
    ``gamma``, ``lr``, ``lookahead_steps``, ``max_tokens``)."""
    names = [n for n in ("optimizer", "eta", "gamma", "lr", "lookahead_steps") if getattr(cfg, "gradinit_" + n, None) is None
             and not (n == "gamma" and getattr(cfg, "gradinit_gamma_init_factor", None) is not None)]
    if not cfg_value(cfg, "gradinit_max_tokens"):
        names.append("max_tokens")
    return names


def gradinit_batch_tokens(cfg) -> Optional[int]:
    """Tokens drawn per GradInit iteration: ``--gradinit-max-tokens``, else (2 - overlap) x
    ``--max-tokens`` (S, 1/(2 - overlap) of the draw, is then one training batch); None if neither is set."""
    explicit = cfg_value(cfg, "gradinit_max_tokens")
    if explicit:
        return int(explicit)
    train = cfg_value(cfg, "gradinit_train_max_tokens")
    if not train:
        return None
    try:
        overlap = float(cfg_value(cfg, "gradinit_overlap", 0.5))
    except (TypeError, ValueError):
        overlap = 0.5
    return int(round((2.0 - min(max(overlap, 0.0), 1.0)) * int(train)))

