"""The ``--gradinit-*`` options as a core :class:`GradInitConfig`, and their errors worded as argparse
words its own ('argument --flag: ...'), checked when the command line is parsed."""
import re
from typing import Optional

from ..core import GradInitConfig
from ..core.config import first_step
from ..core.options import parse_scale_bounds, values_from
from .cfg import cfg_value
from .init_file import (  # noqa: F401  (read_init_file: re-exported)
    combination_error, compute_only_defaults, read_init_file,
)
from .monitor import monitor_option_error
from .options import ENGINE_OPTIONS, GradInitOptions


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
    lr = None
    if values["eta"] is None:
        lr = cfg_value(cfg, "gradinit_train_lr")
        if lr is None:
            raise ValueError("--gradinit-eta is not set and the training --lr is unknown; pass --gradinit-eta")
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
    ``gamma``, ``max_tokens``)."""
    names = [n for n in ("optimizer", "eta", "gamma") if getattr(cfg, "gradinit_" + n, None) is None
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


class GradInitStop(SystemExit):
    """Ends ``fairseq-train`` with one message on stderr and no traceback (exit status 1)."""

    def __init__(self, message: str):
        super().__init__(f"gradinit: error: {message}")


_CONFIG_ERROR = re.compile(r"^GradInitConfig\.(\w+)=(.*?) is invalid: (.*)$", re.S)


def gradinit_enabled(cfg) -> bool:
    """Whether GradInit runs or applies saved scales (``--gradinit-iters`` > 0 or an init file)."""
    iters = cfg_value(cfg, "gradinit_iters", 0)
    return bool((isinstance(iters, int) and iters > 0) or cfg_value(cfg, "gradinit_init_file"))


def _as_argument_error(message: str, eta_from_lr: bool) -> str:
    """A GradInitConfig/option ValueError as argparse words it: 'argument --flag: ...'."""
    m = _CONFIG_ERROR.match(message)
    if m:
        name, value, rest = m.groups()
        flag = "--gradinit-" + name.replace("_", "-")
        if name == "eta" and eta_from_lr:
            flag = "--lr (the default of --gradinit-eta)"
        return f"argument {flag}: invalid value {value}: {rest}"
    if message.startswith("--gradinit-"):
        flag, _, rest = message.partition(" ")
        return f"argument {flag}: {rest}"
    return message


def gradinit_option_error(cfg) -> Optional[str]:
    """The first invalid ``--gradinit-*`` value of ``cfg`` as 'argument --flag: ...', or None.

    ``cfg`` is the task config (or a :class:`~.plan.GradInitPlan`). The ranges are those of
    :class:`GradInitConfig`; ``--lr`` is checked as GradInit's eta only when GradInit computes
    (``--gradinit-iters`` > 0).
    """
    monitor_error = monitor_option_error(cfg)
    if monitor_error:
        return monitor_error
    iters = cfg.gradinit_iters
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        return f"argument --gradinit-iters: invalid value {iters!r}: expected an integer >= 0 (0 = GradInit off)"
    max_tokens = cfg.gradinit_max_tokens
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        return f"argument --gradinit-max-tokens: invalid value {max_tokens!r}: expected an integer >= 1"
    interval = getattr(cfg, "gradinit_checkpoint_interval", 0)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        return (f"argument --gradinit-checkpoint-interval: invalid value {interval!r}: expected an integer >= 0 "
                "(0 = never)")
    eta_from_lr = cfg.gradinit_eta is None
    clamp = getattr(cfg, "gradinit_init_clamp", None)
    if clamp and not cfg.gradinit_init_file:
        return ("argument --gradinit-init-clamp: clamps the scales of --gradinit-init-file, and none is given: add "
                "--gradinit-init-file PATH, or bound scales that GradInit computes with --gradinit-scale-bounds")
    try:
        # --lr matters only when GradInit computes (an init file or GradInit off never uses eta).
        gradinit_config_from_task(cfg, lr_matters=iters > 0)
        if cfg.gradinit_init_file:
            read_init_file(cfg.gradinit_init_file)
        if clamp:
            parse_scale_bounds(clamp, flag="--gradinit-init-clamp")
    except ValueError as e:
        return _as_argument_error(str(e), eta_from_lr)
    return combination_error(cfg, defaults=compute_only_defaults(GradInitOptions))


def unsupported_setup_error(cfg) -> Optional[str]:
    """Why GradInit cannot run in this distributed setup (and what to do), or None."""
    if str(cfg_value(cfg, "gradinit_ddp_backend", "")) == "fully_sharded":
        return ("--ddp-backend fully_sharded is not supported with --gradinit-*: FSDP shards and flattens the "
                "parameters GradInit scales. Use --ddp-backend pytorch_ddp, legacy_ddp or no_c10d, or drop "
                "--gradinit-iters/--gradinit-init-file")
    mp = cfg_value(cfg, "gradinit_model_parallel_size", 1)
    if isinstance(mp, int) and mp > 1:
        return (f"--model-parallel-size {mp} is not supported with --gradinit-*: model parallelism splits each "
                "tensor across ranks and GradInit needs whole tensors. Use --model-parallel-size 1 (data "
                "parallel), or drop --gradinit-iters/--gradinit-init-file")
    if cfg_value(cfg, "gradinit_pipeline_model_parallel", False) is True:
        return ("--pipeline-model-parallel is not supported with --gradinit-*: GradInit needs the whole model on "
                "each rank. Train data parallel (drop --pipeline-model-parallel), or drop "
                "--gradinit-iters/--gradinit-init-file")
    return None


def batch_setting_error(cfg) -> Optional[str]:
    """Why GradInit cannot batch the training data with these settings, or None.

    GradInit's batches hold a token budget (split into S and S~); ``--batch-size`` alone gives
    none. A budget below the longest sentence is not an error: such sentences are skipped, as
    fairseq-train's own training iterator skips them.
    """
    if cfg_value(cfg, "gradinit_init_file"):
        return None
    if not (cfg_value(cfg, "gradinit_max_tokens") or cfg_value(cfg, "gradinit_train_max_tokens")):
        return ("argument --gradinit-max-tokens: GradInit draws batches of a number of tokens and none is set: "
                "pass --max-tokens N (or --gradinit-max-tokens N; --batch-size alone is not enough)")
    return None


def check_when_parsed(parser, check) -> None:
    """Make ``parser`` refuse what ``check(namespace) -> message or None`` finds, the way it refuses
    its own arguments: after the parse, ``parser.error`` prints the usage and 'error: ...' and exits
    with status 2. Adding the same check twice has no effect."""
    checks = getattr(parser, "_gradinit_checks", None)
    if checks is None:
        checks = parser._gradinit_checks = []
        parse_known_args = parser.parse_known_args  # parse_args goes through it

        def checked(*args, **kwargs):
            ns, extra = parse_known_args(*args, **kwargs)
            for fn in checks:
                error = fn(ns)
                if error is not None:
                    parser.error(error)
            return ns, extra

        parser.parse_known_args = checked
    if check not in checks:
        checks.append(check)


#: Checks registered with :func:`check_every_parse`, in the order they were registered.
PARSE_CHECKS: list = []


def check_every_parse(check) -> None:
    """Make every ``fairseq-train`` parser of a task the plugin serves refuse what
    ``check(namespace) -> message or None`` finds (see :func:`check_when_parsed`), before the
    ``--gradinit-*`` checks. For the models and optimizers the plugin registers: fairseq hands their
    ``add_args`` an argument group, not the parser. Registering the same check twice has no effect."""
    if check not in PARSE_CHECKS:
        PARSE_CHECKS.append(check)
