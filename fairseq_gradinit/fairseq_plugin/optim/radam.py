"""``--optimizer radam``: fairseq optimizer on ``torch.optim.RAdam`` (fairseq 0.12 has none).

The flags are ``--adam-betas``/``--adam-eps``/``--weight-decay``, as with ``--optimizer adam`` and as
the Admin authors' fairseq fork used them with ``--optimizer radam``. Unlike the Admin authors' RAdam,
which makes no update while the rectification term is undefined (rho_t <= 4), torch's RAdam takes an
unrectified momentum step in those first updates; this wrapper keeps torch's behaviour.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from ...command_line.argtypes import parse_betas


@dataclass
class FairseqRAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default="(0.9, 0.999)", metadata={"help": "betas for the RAdam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for the RAdam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    decoupled_weight_decay: bool = field(
        default=False, metadata={"help": "decay the weights directly (AdamW-style) instead of an L2 term in the gradient"}
    )
    lr: List[float] = II("optimization.lr")


@register_optimizer("radam", dataclass=FairseqRAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    def __init__(self, cfg: FairseqRAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.RAdam(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        return {
            "lr": self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr,
            "betas": parse_betas(self.cfg.adam_betas),
            "eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
            "decoupled_weight_decay": self.cfg.decoupled_weight_decay,
        }

    @property
    def supports_flat_params(self):
        return True
