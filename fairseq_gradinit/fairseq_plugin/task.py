"""``translation_gradinit``: fairseq's translation task that runs GradInit before training.

GradInit runs in ``build_criterion``: ``fairseq-train`` calls ``task.build_model`` and then
``task.build_criterion`` before the Trainer casts the model to fp16/bf16 and before the optimizer
copies fp32 master weights, so training starts from exactly the GradInit weights. Inference
entry points build the model with ``from_checkpoint=True`` (and never build the training
criterion with a fresh model), so they never run it; nor does a run that resumes from a
checkpoint.
"""

import ast
import contextlib
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from fairseq import utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import TASK_DATACLASS_REGISTRY, TASK_REGISTRY, register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from ..core import BatchPair, GradInitConfig, ScaleBound, apply_scales, gradinit, summarize_scales
from .cfg import cfg_value
from .files import atomic_write_json, remove_stale_temp_files
from .groups import transformer_group
from .init_file import combination_error, compute_only_defaults, read_init_file, read_usable_init_file
from .provenance import COMPARED_KEYS, INIT_FILE_KEYS, fingerprint, fingerprint_diff, model_arguments
from .wskip import admin_profile_if_requested, pre_ln_argument_error

logger = logging.getLogger(__name__)

GRADINIT_JSON = "gradinit.json"


@dataclass
class TranslationGradInitConfig(TranslationConfig):
    gradinit_iters: int = field(
        default=0, metadata={"help": "GradInit iterations before training (0 = GradInit off; paper: 780)"}
    )
    gradinit_optimizer: Optional[ChoiceEnum(["adam", "sgd"])] = field(
        default=None,
        metadata={"help": "optimizer GradInit prepares the first step of: adam (A[g]=sign g, l1 norm) or "
                          "sgd (A[g]=g, l2 norm); default: follow --optimizer (adam if it is not sgd/nag)"},
    )
    gradinit_eta: Optional[float] = field(
        default=None, metadata={"help": "eta, learning rate of the first step GradInit optimizes "
                                        "(default: the training --lr)"}
    )
    gradinit_gamma: Optional[float] = field(
        default=None, metadata={"help": "gamma, bound on the gradient norm (default: rule of thumb "
                                        "eta*gamma=0.1 for Adam, eta*gamma^2=0.1 for SGD)"}
    )
    gradinit_lr: float = field(default=2.5e-3, metadata={"help": "tau, learning rate of the scales' Adam"})
    gradinit_betas: str = field(default="(0.9, 0.98)", metadata={"help": "betas of the scales' Adam"})
    gradinit_min_scale: float = field(default=0.01, metadata={"help": "lower bound of every scale"})
    gradinit_max_scale: Optional[float] = field(default=None, metadata={"help": "upper bound of every scale"})
    gradinit_scale_bounds: Optional[str] = field(
        default=None, metadata={"help": "per-group scale bounds, first match wins: a Python list of (select, min, "
                                        "max) with select 'bias', 'norm' (normalization weights) or 're:<regex>' "
                                        "on the name, None keeping the global bound; the authors' IWSLT setting: "
                                        "\"[('bias', 0, None), ('norm', None, 100)]\""}
    )
    gradinit_step_params: ChoiceEnum(["all", "scaled"]) = field(
        default="all", metadata={"help": "tensors in g, ||g|| and the simulated step: all trainable ones (as the "
                                         "real first step) or only those with a scale (all-zero tensors left out)"}
    )
    gradinit_max_tokens: Optional[int] = field(
        default=None, metadata={"help": "tokens drawn per GradInit iteration, split into S and S~ "
                                        "(each 1/(2-overlap) of it; default: --max-tokens)"}
    )
    gradinit_overlap: float = field(
        default=0.5, metadata={"help": "fraction of S~ shared with S (paper: 0.5)"}
    )
    gradinit_sgd_step: ChoiceEnum(["grad", "normalized"]) = field(
        default="grad", metadata={"help": "SGD step form: grad (A[g]=g, Eq. 2 and the authors' code) or "
                                          "normalized (A[g]=gamma*g/||g||_2, the paper's text)"}
    )
    gradinit_adam_state: ChoiceEnum(["shared", "per_branch"]) = field(
        default="shared", metadata={"help": "moments of the scales' Adam: shared by all iterations, or per_branch "
                                            "(constraint and objective iterations keep their own, as the "
                                            "authors' fairseq code does)"}
    )
    gradinit_scale_grad_clip: Optional[float] = field(
        default=None, metadata={"help": "clip the norm of the scale gradient (default: no clipping)"}
    )
    gradinit_constraint_grad: ChoiceEnum(["exact", "finite_difference"]) = field(
        default="exact", metadata={"help": "gradient of ||g|| in constraint iterations: exact (double "
                                           "backward, Algorithm 1) or finite_difference (one more first-order "
                                           "pass over S; about half the cost, approximate)"}
    )
    gradinit_fd_eps: float = field(
        default=1e-4, metadata={"help": "relative step of --gradinit-constraint-grad finite_difference"}
    )
    gradinit_init_file: Optional[str] = field(
        default=None, metadata={"help": "apply the scales of a saved gradinit.json instead of computing "
                                        "them (same architecture and --seed give the same weights)"}
    )
    gradinit_log_interval: int = field(default=20, metadata={"help": "log GradInit progress every N iterations"})
    # Global settings the task needs; not command-line options of their own.
    # Typed Any, not bool/int: fairseq's namespace-to-config conversion casts bool/int fields, and
    # bool("${common.cpu}") is True, which silently ran GradInit on the CPU of GPU machines.
    gradinit_train_lr: Any = II("optimization.lr")
    gradinit_train_max_tokens: Any = II("dataset.max_tokens")
    gradinit_train_optimizer: Optional[str] = "${oc.select:optimizer._name,null}"
    gradinit_cpu: Any = II("common.cpu")
    gradinit_seed: Any = II("common.seed")
    gradinit_save_dir: str = II("checkpoint.save_dir")
    gradinit_restore_file: str = II("checkpoint.restore_file")
    gradinit_checkpoint_suffix: str = II("checkpoint.checkpoint_suffix")
    gradinit_finetune_from_model: Optional[str] = II("checkpoint.finetune_from_model")
    gradinit_continue_once: Optional[str] = II("checkpoint.continue_once")
    gradinit_reset_optimizer: Any = II("checkpoint.reset_optimizer")
    gradinit_reset_lr_scheduler: Any = II("checkpoint.reset_lr_scheduler")
    gradinit_reset_meters: Any = II("checkpoint.reset_meters")
    gradinit_reset_dataloader: Any = II("checkpoint.reset_dataloader")
    gradinit_ddp_backend: Any = II("distributed_training.ddp_backend")
    gradinit_pipeline_model_parallel: Any = II("distributed_training.pipeline_model_parallel")
    gradinit_model_parallel_size: Any = II("common.model_parallel_size")


_COMPUTE_ONLY_DEFAULTS = compute_only_defaults(TranslationGradInitConfig)


def gradinit_config_from_task(cfg) -> GradInitConfig:
    """Translate the task's ``--gradinit-*`` options into a core :class:`GradInitConfig`."""
    opt = cfg.gradinit_optimizer
    if opt is None:
        train_opt = cfg_value(cfg, "gradinit_train_optimizer")
        opt = "sgd" if train_opt in ("sgd", "nag") else "adam"
    eta = cfg.gradinit_eta
    if eta is None:
        lr = cfg_value(cfg, "gradinit_train_lr")
        if lr is None:
            raise ValueError("--gradinit-eta is not set and the training --lr is unknown; pass --gradinit-eta")
        eta = float(lr[0] if isinstance(lr, (list, tuple)) or hasattr(lr, "__getitem__") else lr)
    try:
        betas = tuple(float(b) for b in ast.literal_eval(cfg.gradinit_betas))
    except (ValueError, SyntaxError, TypeError):
        raise ValueError(f"--gradinit-betas {cfg.gradinit_betas!r} is invalid: expected e.g. '(0.9, 0.98)'")
    return GradInitConfig(
        optimizer=str(opt), eta=eta, gamma=cfg.gradinit_gamma, lr=cfg.gradinit_lr, betas=betas,
        iters=int(cfg.gradinit_iters), min_scale=cfg.gradinit_min_scale, max_scale=cfg.gradinit_max_scale,
        overlap=cfg.gradinit_overlap, scale_grad_clip=cfg.gradinit_scale_grad_clip,
        sgd_step=str(cfg.gradinit_sgd_step), adam_state=str(cfg.gradinit_adam_state),
        scale_bounds=parse_scale_bounds(cfg.gradinit_scale_bounds), step_params=str(cfg.gradinit_step_params),
        log_interval=int(cfg.gradinit_log_interval),
        constraint_grad=str(cfg.gradinit_constraint_grad), fd_eps=float(cfg.gradinit_fd_eps),
    )


def parse_scale_bounds(text: Optional[str]) -> tuple:
    """``--gradinit-scale-bounds`` as (select, min, max) tuples (validated by GradInitConfig)."""
    if not text:
        return ()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        value = [value]  # a single bound
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"--gradinit-scale-bounds {text!r} is invalid: expected a list of (select, min, max), "
                         "e.g. \"[('bias', 0, None), ('norm', None, 100)]\"")
    try:
        return tuple(ScaleBound.coerce(b) for b in value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--gradinit-scale-bounds {text!r} is invalid: {e}") from None


def restore_source(cfg) -> Optional[str]:
    """The checkpoint ``fairseq-train`` will load model weights from, or None for a fresh model.

    A line-by-line mirror of fairseq's ``checkpoint_utils.load_checkpoint`` (which path: the
    ``--save-dir``'s ``checkpoint_last{suffix}.pt``, else ``--continue-once``, else
    ``--finetune-from-model``; or ``--restore-file`` with the suffix) and ``Trainer.load_checkpoint``
    (weights load iff that path is a file). The ``--reset-*`` flags never stop the weights from
    loading. The option combinations fairseq refuses raise its own ``ValueError`` here, before
    GradInit spends any time, instead of after it.
    """
    from fairseq.file_io import PathManager

    save_dir = cfg_value(cfg, "gradinit_save_dir", "checkpoints")
    restore = cfg_value(cfg, "gradinit_restore_file", "checkpoint_last.pt")
    suffix = cfg_value(cfg, "gradinit_checkpoint_suffix", "") or ""  # Trainer.checkpoint_suffix without FSDP
    finetune = cfg_value(cfg, "gradinit_finetune_from_model")
    continue_once = cfg_value(cfg, "gradinit_continue_once")
    resets = [cfg_value(cfg, f"gradinit_reset_{k}", False) for k in ("optimizer", "lr_scheduler", "meters", "dataloader")]
    if finetune is not None and any(resets):
        raise ValueError("--finetune-from-model can not be set together with either --reset-optimizer"
                         " or reset_lr_scheduler or reset_meters or reset_dataloader")
    if restore == "checkpoint_last.pt":
        path = os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
        first_launch = not PathManager.exists(path)
        if first_launch and continue_once is not None:
            path = continue_once
        elif finetune is not None and first_launch:
            if not PathManager.exists(finetune):
                raise ValueError(f"--finetune-from-model {finetune} does not exist")
            path = finetune
    else:
        path = restore.replace(".pt", suffix + ".pt")
    if restore != "checkpoint_last.pt" and finetune:
        raise ValueError("--finetune-from-model and --restore-file (non-default value) can not be specified together")
    return path if PathManager.isfile(path) else None


def will_restore_checkpoint(cfg) -> bool:
    """Whether fairseq-train will load model weights from a checkpoint (see :func:`restore_source`)."""
    return restore_source(cfg) is not None


# -- checks of the --gradinit-* options and of the setup -------------------------------------
class GradInitStop(SystemExit):
    """Ends ``fairseq-train`` with one message on stderr and no traceback (exit status 1)."""

    def __init__(self, message: str):
        super().__init__(f"gradinit: error: {message}")


class _View:
    """``base`` with some attributes replaced (a parsed namespace seen as the task config)."""

    def __init__(self, base, **overrides):
        self._base, self._overrides = base, overrides

    def __getattr__(self, key):
        if key in self._overrides:
            return self._overrides[key]
        return getattr(self._base, key)


_CONFIG_ERROR = re.compile(r"^GradInitConfig\.(\w+)=(.*?) is invalid: (.*)$", re.S)


def _gradinit_enabled(cfg) -> bool:
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

    ``cfg`` is the task config (or a parsed namespace seen as one). The ranges are those of
    :class:`GradInitConfig`; ``--lr`` is checked as GradInit's eta only when GradInit computes
    (``--gradinit-iters`` > 0).
    """
    iters = cfg.gradinit_iters
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        return f"argument --gradinit-iters: invalid value {iters!r}: expected an integer >= 0 (0 = GradInit off)"
    max_tokens = cfg.gradinit_max_tokens
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        return f"argument --gradinit-max-tokens: invalid value {max_tokens!r}: expected an integer >= 1"
    eta_from_lr = cfg.gradinit_eta is None
    # --lr matters only when GradInit computes (an init file or GradInit off never uses eta).
    view = cfg if iters > 0 or not eta_from_lr else _View(cfg, gradinit_eta=GradInitConfig.eta)
    try:
        gradinit_config_from_task(view)
        if cfg.gradinit_init_file:
            read_usable_init_file(cfg.gradinit_init_file)
    except ValueError as e:
        return _as_argument_error(str(e), eta_from_lr)
    return combination_error(cfg, defaults=_COMPUTE_ONLY_DEFAULTS)


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


def namespace_error(ns) -> Optional[str]:
    """:func:`gradinit_option_error` and :func:`unsupported_setup_error` of a parsed
    ``fairseq-train`` namespace (what the parser refuses)."""
    if not hasattr(ns, "gradinit_iters"):
        return None
    if pre_ln_argument_error(ns):
        return pre_ln_argument_error(ns)
    view = _View(ns, gradinit_train_lr=getattr(ns, "lr", None), gradinit_train_optimizer=getattr(ns, "optimizer", None),
                 gradinit_train_max_tokens=getattr(ns, "max_tokens", None),
                 gradinit_ddp_backend=getattr(ns, "ddp_backend", None),
                 gradinit_model_parallel_size=getattr(ns, "model_parallel_size", 1),
                 gradinit_pipeline_model_parallel=getattr(ns, "pipeline_model_parallel", False))
    error = gradinit_option_error(view)
    if error is None and _gradinit_enabled(view):
        error = unsupported_setup_error(view)
    return error


def _refuse_bad_values_when_parsed(parser) -> None:
    """Make ``parser`` refuse bad ``--gradinit-*`` values the way it refuses its own: after the
    parse (the ranges depend on each other and on --lr), ``parser.error`` prints the usage and
    'error: argument --gradinit-...: ...' and exits with status 2."""
    if getattr(parser, "_gradinit_checks_values", False):
        return
    parser._gradinit_checks_values = True
    parse_known_args = parser.parse_known_args  # parse_args goes through it

    def checked(*args, **kwargs):
        ns, extra = parse_known_args(*args, **kwargs)
        error = namespace_error(ns)
        if error is not None:
            parser.error(error)
        return ns, extra

    parser.parse_known_args = checked


def mean_loss_fn(criterion):
    """The loss the optimizer differentiates: fairseq's summed loss divided by the sample size."""

    def loss_fn(model, sample):
        loss, sample_size, _ = criterion(model, sample)
        return loss / max(float(sample_size), 1.0)

    return loss_fn


def _rank_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _saved_result_decision(path: str, current: dict) -> tuple:
    """('run', None), ('reuse', None) or ('stop', message) for an existing ``gradinit.json``."""
    if not os.path.exists(path):
        return ("run", None)
    advice = (f"GradInit never overwrites it: use another --save-dir, delete {path} to compute it again, or "
              f"pass --gradinit-init-file {path} to apply its scales")
    try:
        saved = read_init_file(path)
    except ValueError as e:
        return ("stop", f"{path} exists but is not a usable GradInit result ({str(e).split(': ', 1)[-1]}). {advice}")
    diff = fingerprint_diff(saved.get("fingerprint"), current, keys=COMPARED_KEYS)
    if diff:
        return ("stop", f"{path} exists and was written by a different run ({'; '.join(diff)}). {advice}")
    if saved["fingerprint"].get("version") != current.get("version"):
        logger.info("gradinit: %s was written by fairseq_gradinit %s (this is %s)", path,
                    saved["fingerprint"].get("version"), current.get("version"))
    return ("reuse", None)


class _Interrupted(KeyboardInterrupt):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _sigterm_raises_interrupt():
    """SIGTERM (a scheduler stopping the job) raises like Ctrl-C does, so GradInit stops cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@register_task("translation_gradinit", dataclass=TranslationGradInitConfig)
class TranslationGradInitTask(TranslationTask):
    """Translation with GradInit (``--gradinit-iters N``) before the first update."""

    cfg: TranslationGradInitConfig

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        _refuse_bad_values_when_parsed(parser)

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self._gradinit_model = None
        self._gradinit_model_args = None
        self._gradinit_criterion_cfg = None
        self.gradinit_result = None

    def build_model(self, cfg, from_checkpoint=False):
        if not from_checkpoint and _gradinit_enabled(self.cfg):
            # The model's arguments as given: building fills in derived ones (e.g. the shared
            # output embedding), and the fingerprint must equal the one of the command line.
            self._gradinit_model_args = model_arguments(cfg)
        model = super().build_model(cfg, from_checkpoint)
        # Remember a freshly built training model; GradInit runs once the criterion exists.
        self._gradinit_model = None if from_checkpoint else model
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint=from_checkpoint)
        model, self._gradinit_model = self._gradinit_model, None
        if model is None or from_checkpoint:
            return criterion
        enabled = _gradinit_enabled(self.cfg)
        self._gradinit_criterion_cfg = cfg
        # The command line was checked when parsed; this also covers configs built otherwise
        # (fairseq-hydra-train, Python). Checked before Admin's profiling and GradInit, so that
        # stopping here costs nothing.
        error = gradinit_option_error(self.cfg)
        if error is None and enabled:
            error = unsupported_setup_error(self.cfg)
        if error is not None:
            raise GradInitStop(error)
        source = restore_source(self.cfg)
        if source is None:
            admin_profile_if_requested(model, self)  # transformer_wskip --wskip-init admin; before GradInit
        if enabled:
            if source is not None:
                logger.info("gradinit: a checkpoint will be restored; not running GradInit (fairseq loads %s)", source)
            else:
                self.run_gradinit(model, criterion)
        return criterion

    # ------------------------------------------------------------------------------------
    def run_gradinit(self, model, criterion):
        """Run GradInit (or apply ``--gradinit-init-file``) on ``model`` in place."""
        cfg = self.cfg
        rank, world = _rank_world()
        save_dir = cfg_value(cfg, "gradinit_save_dir", "checkpoints")
        path = os.path.join(save_dir, GRADINIT_JSON)
        current = self.gradinit_fingerprint(world) if rank == 0 else None
        if cfg.gradinit_init_file:
            return self._apply_saved(model, cfg.gradinit_init_file, current, INIT_FILE_KEYS, "--gradinit-init-file")

        # An existing gradinit.json is never overwritten: the same run reuses it, another stops.
        # Rank 0 decides for all ranks, so they cannot split between computing and reusing.
        decision = _saved_result_decision(path, current) if rank == 0 else None
        if world > 1:
            box = [decision]
            dist.broadcast_object_list(box, src=0)
            decision = box[0]
        if decision[0] == "stop":
            raise GradInitStop(decision[1])
        if decision[0] == "reuse":
            logger.info("gradinit: %s exists and its fingerprint matches this run (model, criterion, seed, data, "
                        "world size, GradInit settings); applying its scales instead of running GradInit", path)
            return self._apply_saved(model, path, None, (), "reused")

        gcfg = gradinit_config_from_task(cfg)
        use_cuda = torch.cuda.is_available() and not cfg_value(cfg, "gradinit_cpu", False)
        device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        orig_device = next(model.parameters()).device
        orig_dtype = next(model.parameters()).dtype
        if orig_dtype != torch.float32:
            raise ValueError(f"GradInit expects the freshly built fp32 model, got {orig_dtype}")
        max_tokens = cfg.gradinit_max_tokens or cfg_value(cfg, "gradinit_train_max_tokens")
        if not max_tokens:
            raise ValueError("set --gradinit-max-tokens (or --max-tokens) for GradInit's batches")
        logger.info(
            "gradinit: %d iterations on %s, optimizer=%s eta=%g gamma=%g tau=%g, %d tokens per "
            "iteration (S and S~ share %.0f%%), rank %d/%d", gcfg.iters, device, gcfg.optimizer,
            gcfg.eta, gcfg.resolved_gamma, gcfg.lr, max_tokens, 100 * gcfg.overlap, rank, world)

        if rank == 0:
            for tmp in remove_stale_temp_files(save_dir, GRADINIT_JSON):
                logger.info("gradinit: removed %s, left by an interrupted run", tmp)
        model.to(device)
        drawn = [0]

        def counted(it):
            for pair in it:
                drawn[0] += 1
                yield pair

        pairs = counted(self.gradinit_pairs(model, max_tokens, gcfg.overlap, device, rank, world))

        start = time.time()
        with _sigterm_raises_interrupt():
            try:
                try:
                    result = gradinit(model, pairs, mean_loss_fn(criterion), gcfg)
                finally:
                    model.to(orig_device)
                    if use_cuda:
                        torch.cuda.empty_cache()
                self.gradinit_result = result
                summary = self._log_summary(result.scales)
                if rank == 0:
                    out = result.to_dict()
                    out.update(summary=summary, max_tokens=max_tokens, device=str(device),
                               wall_time=time.time() - start, fingerprint=current)
                    atomic_write_json(path, out)
                    logger.info("gradinit: wrote %s", path)
            except KeyboardInterrupt as e:
                signum = getattr(e, "signum", signal.SIGINT)
                done = "the GradInit result" if self.gradinit_result is not None else \
                    f"iteration {drawn[0]} of {gcfg.iters}"
                logger.error("gradinit: stopped by %s during %s; nothing was written to %s and training did not "
                             "start. Run the same command again to start GradInit from the beginning.",
                             signal.Signals(signum).name, done, save_dir)
                raise SystemExit(128 + signum) from None
        return result

    def gradinit_fingerprint(self, world_size: int) -> dict:
        """:func:`~.provenance.fingerprint` of this run (model arguments as given on the command line)."""
        return fingerprint(task_cfg=self.cfg, model_cfg=None, criterion_cfg=self._gradinit_criterion_cfg,
                           seed=cfg_value(self.cfg, "gradinit_seed"), world_size=world_size,
                           model_args=self._gradinit_model_args)

    def _apply_saved(self, model, path: str, current: Optional[dict], keys, source: str):
        """Apply the scales saved at ``path`` after checking they name this model's tensors."""
        try:
            saved = read_usable_init_file(path) if source == "--gradinit-init-file" else read_init_file(path)
        except ValueError as e:
            raise GradInitStop(str(e)) from None
        scales = saved["scales"]
        names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
        known = set(names)
        missing = [n for n in scales if n not in known]
        if missing:
            raise GradInitStop(
                f"{source} {path}: {len(missing)} of its {len(scales)} scales name tensors this model does not "
                f"have, e.g. {missing[:5]} (the model has e.g. {names[:3]}); it was computed for another "
                "architecture")
        if current is not None and keys:
            diff = fingerprint_diff(saved.get("fingerprint"), current, keys=keys)
            if diff:
                logger.warning(
                    "gradinit: WARNING: %s %s was computed for a different model, seed or data than this run (%s). "
                    "Its scales fit the initial weights of that run; applying them anyway.", source, path,
                    "; ".join(diff))
        apply_scales(model, scales)
        logger.info("gradinit: applied %d scales from %s", len(scales), path)
        self._log_summary(scales)
        return None

    def _log_summary(self, scales):
        summary = summarize_scales(scales, transformer_group)
        logger.info("gradinit: scales by group (count min/mean/max)")
        for group, s in summary.items():
            logger.info("  %-32s %3d  %.4f / %.4f / %.4f", group, s["count"], s["min"], s["mean"], s["max"])
        return summary

    def gradinit_pairs(self, model, max_tokens: int, overlap: float, device, rank: int = 0,
                       world: int = 1) -> Iterator[BatchPair]:
        """Endless (S, S~) pairs from this rank's shard of the training data.

        Each pair draws one batch of ``max_tokens`` tokens (fairseq's length-bucketed batching),
        shuffles its sentences and splits them so S and S~ each hold 1/(2-overlap) of it and share
        ``overlap`` of S (thirds for overlap 0.5, as the authors' fairseq code does).
        """
        cfg = self.cfg
        split = cfg.train_subset
        if split not in self.datasets:
            self.load_dataset(split, epoch=1, combine=True)
        dataset = self.dataset(split)
        max_positions = utils.resolve_max_positions(self.max_positions(), model.max_positions())
        seed = int(cfg_value(cfg, "gradinit_seed", 1) or 1)

        def gen():
            epoch = 0
            while True:
                epoch += 1
                rng = np.random.RandomState((seed + 7919 * epoch) % (2 ** 32))
                indices = dataset.ordered_indices()
                indices = self.filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs=True)
                batches = dataset.batch_by_size(indices, max_tokens=max_tokens, max_sentences=None,
                                                required_batch_size_multiple=1)
                batches = [batches[i] for i in rng.permutation(len(batches))]
                shard = batches[rank::world]
                if not shard:
                    raise ValueError(f"rank {rank} got no GradInit batch: the training set has fewer "
                                     f"batches of {max_tokens} tokens than there are ranks ({world})")
                for idx in shard:
                    idx = np.asarray(idx)[rng.permutation(len(idx))]
                    n = len(idx)
                    if n < 2:
                        s_idx = st_idx = idx
                    else:
                        n_s = min(n, max(1, int(round(n / (2.0 - overlap)))))
                        k = int(round(overlap * n_s))
                        s_idx, st_idx = idx[:n_s], idx[n_s - k:n_s - k + n_s]
                        if len(st_idx) == 0:
                            st_idx = s_idx
                    yield BatchPair(self._collate(dataset, s_idx, device), self._collate(dataset, st_idx, device))

        return gen()

    @staticmethod
    def _collate(dataset, idx, device):
        sample = dataset.collater([dataset[int(i)] for i in idx])
        return utils.apply_to_sample(lambda t: t.to(device), sample)


# `fairseq-train DATA --user-dir fairseq_gradinit --gradinit-iters 780` (no --task) uses fairseq's
# default task "translation": serve it with the GradInit-aware subclass. GradInit stays off unless
# --gradinit-iters > 0 (or --gradinit-init-file), so plain translation runs are unchanged.
def _serve_default_translation_task() -> bool:
    if TASK_REGISTRY.get("translation") is not TranslationTask:
        return False
    from hydra.core.config_store import ConfigStore

    TASK_REGISTRY["translation"] = TranslationGradInitTask
    TASK_DATACLASS_REGISTRY["translation"] = TranslationGradInitConfig
    node = TranslationGradInitConfig()
    node._name = "translation"
    # fairseq validates the parsed options against this schema (convert_namespace_to_omegaconf).
    ConfigStore.instance().store(name="translation", group="task", node=node, provider="fairseq")
    return True


def _log_changes_to_fairseq() -> None:
    """Say once, at load, what the plugin changes in fairseq (the README lists both)."""
    import fairseq.checkpoint_utils as checkpoint_utils

    from .compat import _TorchWithPickleLoad

    changes = []
    if TASK_REGISTRY.get("translation") is TranslationGradInitTask:
        changes.append("task 'translation' is served by TranslationGradInitTask (identical unless "
                       "--gradinit-iters/--gradinit-init-file is given)")
    if isinstance(getattr(checkpoint_utils, "torch", None), _TorchWithPickleLoad):
        changes.append("fairseq's checkpoint loading passes torch.load(weights_only=False) "
                       "(load only checkpoints you trust)")
    if changes:
        logger.info("fairseq_gradinit plugin loaded; changes to fairseq: %s", "; ".join(changes))


_serve_default_translation_task()
_log_changes_to_fairseq()
