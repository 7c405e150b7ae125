"""``translation_gradinit``: fairseq's translation task that runs GradInit before training.

GradInit runs in ``build_criterion``: ``fairseq-train`` calls ``task.build_model`` and then
``task.build_criterion`` before the Trainer casts the model to fp16/bf16 and before the optimizer
copies fp32 master weights, so training starts from exactly the GradInit weights. Inference
entry points build the model with ``from_checkpoint=True`` (and never build the training
criterion with a fresh model), so they never run it; nor does a run that resumes from a
checkpoint.
"""

import ast
import json
import logging
import os
import tempfile
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

from ..core import BatchPair, GradInitConfig, apply_scales, gradinit, summarize_scales
from .groups import transformer_group

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


def gradinit_config_from_task(cfg) -> GradInitConfig:
    """Translate the task's ``--gradinit-*`` options into a core :class:`GradInitConfig`."""
    opt = cfg.gradinit_optimizer
    if opt is None:
        train_opt = _select(cfg, "gradinit_train_optimizer")
        opt = "sgd" if train_opt in ("sgd", "nag") else "adam"
    eta = cfg.gradinit_eta
    if eta is None:
        lr = _select(cfg, "gradinit_train_lr")
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
        log_interval=int(cfg.gradinit_log_interval),
        constraint_grad=str(cfg.gradinit_constraint_grad), fd_eps=float(cfg.gradinit_fd_eps),
    )


def _select(cfg, key, default=None):
    try:
        value = getattr(cfg, key)
    except Exception:  # unresolvable interpolation (e.g. the task built outside fairseq-train)
        return default
    if isinstance(value, str) and value.startswith("${"):
        return default
    return default if value is None else value


def will_restore_checkpoint(cfg) -> bool:
    """Whether fairseq-train will load model weights from a checkpoint (mirrors checkpoint_utils)."""
    save_dir = _select(cfg, "gradinit_save_dir", "checkpoints")
    restore = _select(cfg, "gradinit_restore_file", "checkpoint_last.pt")
    suffix = _select(cfg, "gradinit_checkpoint_suffix", "") or ""
    finetune = _select(cfg, "gradinit_finetune_from_model")
    if restore == "checkpoint_last.pt":
        if os.path.exists(os.path.join(save_dir, f"checkpoint_last{suffix}.pt")):
            return True
        return bool(finetune)
    path = restore.replace(".pt", suffix + ".pt") if suffix else restore
    return os.path.exists(path)


def _rank_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write_json(path: str, obj: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gradinit.", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        # mkstemp creates the file 0600; give it the permissions an ordinary open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@register_task("translation_gradinit", dataclass=TranslationGradInitConfig)
class TranslationGradInitTask(TranslationTask):
    """Translation with GradInit (``--gradinit-iters N``) before the first update."""

    cfg: TranslationGradInitConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self._gradinit_model = None
        self.gradinit_result = None

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        # Remember a freshly built training model; GradInit runs once the criterion exists.
        self._gradinit_model = None if from_checkpoint else model
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint=from_checkpoint)
        model, self._gradinit_model = self._gradinit_model, None
        enabled = self.cfg.gradinit_iters > 0 or self.cfg.gradinit_init_file
        if model is not None and not from_checkpoint and enabled:
            if will_restore_checkpoint(self.cfg):
                logger.info("gradinit: a checkpoint will be restored; not running GradInit")
            else:
                self.run_gradinit(model, criterion)
        return criterion

    # ------------------------------------------------------------------------------------
    def run_gradinit(self, model, criterion):
        """Run GradInit (or apply ``--gradinit-init-file``) on ``model`` in place."""
        cfg = self.cfg
        rank, world = _rank_world()
        save_dir = _select(cfg, "gradinit_save_dir", "checkpoints")
        if cfg.gradinit_init_file:
            with open(cfg.gradinit_init_file) as f:
                saved = json.load(f)
            if "scales" not in saved:
                raise ValueError(f"--gradinit-init-file {cfg.gradinit_init_file} has no 'scales' entry")
            apply_scales(model, saved["scales"])
            logger.info("gradinit: applied %d scales from %s", len(saved["scales"]), cfg.gradinit_init_file)
            self._log_summary(saved["scales"])
            return None

        gcfg = gradinit_config_from_task(cfg)
        use_cuda = torch.cuda.is_available() and not _select(cfg, "gradinit_cpu", False)
        device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        orig_device = next(model.parameters()).device
        orig_dtype = next(model.parameters()).dtype
        if orig_dtype != torch.float32:
            raise ValueError(f"GradInit expects the freshly built fp32 model, got {orig_dtype}")
        max_tokens = cfg.gradinit_max_tokens or _select(cfg, "gradinit_train_max_tokens")
        if not max_tokens:
            raise ValueError("set --gradinit-max-tokens (or --max-tokens) for GradInit's batches")
        logger.info(
            "gradinit: %d iterations on %s, optimizer=%s eta=%g gamma=%g tau=%g, %d tokens per "
            "iteration (S and S~ share %.0f%%), rank %d/%d", gcfg.iters, device, gcfg.optimizer,
            gcfg.eta, gcfg.resolved_gamma, gcfg.lr, max_tokens, 100 * gcfg.overlap, rank, world)

        model.to(device)
        pairs = self.gradinit_pairs(model, max_tokens, gcfg.overlap, device, rank, world)

        def loss_fn(m, sample):
            loss, sample_size, _ = criterion(m, sample)
            return loss / max(float(sample_size), 1.0)

        start = time.time()
        try:
            result = gradinit(model, pairs, loss_fn, gcfg)
        finally:
            model.to(orig_device)
            if use_cuda:
                torch.cuda.empty_cache()
        self.gradinit_result = result
        summary = self._log_summary(result.scales)
        if rank == 0:
            out = result.to_dict()
            out.update(summary=summary, max_tokens=max_tokens, device=str(device),
                       wall_time=time.time() - start)
            path = os.path.join(save_dir, GRADINIT_JSON)
            _atomic_write_json(path, out)
            logger.info("gradinit: wrote %s", path)
        return result

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
        seed = int(_select(cfg, "gradinit_seed", 1) or 1)

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
def _serve_default_translation_task() -> None:
    if TASK_REGISTRY.get("translation") is not TranslationTask:
        return
    from hydra.core.config_store import ConfigStore

    TASK_REGISTRY["translation"] = TranslationGradInitTask
    TASK_DATACLASS_REGISTRY["translation"] = TranslationGradInitConfig
    node = TranslationGradInitConfig()
    node._name = "translation"
    # fairseq validates the parsed options against this schema (convert_namespace_to_omegaconf).
    ConfigStore.instance().store(name="translation", group="task", node=node, provider="fairseq")


_serve_default_translation_task()
