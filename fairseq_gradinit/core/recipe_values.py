"""The values of the published GradInit settings, as plain data: read by :class:`~.config.GradInitConfig`,
whose defaults are the authors' IWSLT'14 values (:data:`AUTHORS_IWSLT14`) except where
:data:`~.config.AUTHORS_DIFFERENCES` says why not, and by the named recipes of :mod:`.recipes`. Apart from
both so that each value is written once and neither module imports the other's."""
from __future__ import annotations

import types
from typing import Any, Mapping

#: The paper's Appendix A (SGD at the base learning rate 0.1, gamma 1, alpha_min 0.01, batch size 128,
#: tau of VGG-19 without BN; other networks' best tau are listed there) and the authors' CIFAR launch
#: script, zhuchen03/gradinit launch/run_gradinit.sh (--gradinit-normalize-grad, --gradinit-grad-clip 1,
#: 390 iterations: one epoch of 128-image batches). The authors' code besides lets biases reach 0 and
#: keeps separate moments for constraint steps; the recipe keeps the paper's global alpha_min and one
#: Adam, as the vision API does.
PAPER_CIFAR10: Mapping[str, Any] = types.MappingProxyType(dict(
    optimizer="sgd", eta=0.1, gamma=1.0, sgd_step="normalized", lr=1e-2, betas=(0.9, 0.999), iters=390,
    min_scale=0.01, overlap=0.5, scale_grad_clip=1.0))
#: What the CIFAR-10 recipe implies outside the config (front-end option names).
PAPER_CIFAR10_SETTINGS: Mapping[str, Any] = types.MappingProxyType(dict(batch_size=128))

#: The authors' IWSLT'14 launch script, zhuchen03/gradinit fairseq/gradinit/launch/
#: run_iwslt_14_gradinit_no_clipping.sh (eta 1e-3, tau 2.5e-3, betas (0.9, 0.98), 780 iterations,
#: alpha_min 0.01, LayerNorm scales at most 100, clipping at 1e8: none), gamma 1e3 (the paper's
#: Appendix), and what their fairseq code (fairseq/gradinit/train.py) does: biases down to 0, separate
#: moments for constraint steps, every trainable tensor in the simulated step except the tied output
#: projection, 6000-token draws at --max-tokens 4096. Their code also cuts S and S~ out of one batch
#: (pairs="authors", an experimental setting here); the recipe keeps the paper's overlapping pairs.
AUTHORS_IWSLT14: Mapping[str, Any] = types.MappingProxyType(dict(
    optimizer="adam", eta=1e-3, gamma=1e3, lr=2.5e-3, betas=(0.9, 0.98), iters=780, min_scale=0.01, overlap=0.5,
    adam_state="per_branch", step_params="all", scale_bounds=(("bias", 0, None), ("norm", None, 100)),
    unstepped_uses=r"decoder\.output_projection\."))
#: What the IWSLT'14 recipe implies outside the config (front-end option names).
AUTHORS_IWSLT14_SETTINGS: Mapping[str, Any] = types.MappingProxyType(dict(max_tokens=6000))
