"""The ``--gradinit-*`` options of the fairseq plugin (fields of every served task's config)."""
from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II


@dataclass
class GradInitOptions(FairseqDataclass):
    """The ``--gradinit-*`` options, added to the dataclass of every fairseq task the plugin serves."""

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
    gradinit_train_batch_size: Any = II("dataset.batch_size")
    gradinit_train_subset: Any = II("dataset.train_subset")
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
