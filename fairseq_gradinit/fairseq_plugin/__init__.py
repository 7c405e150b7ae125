"""fairseq plugin: registers the ``translation_gradinit`` task, serves every fairseq task with the
``--gradinit-*`` options (``translation`` with ``translation_gradinit``), and registers the
``transformer_wskip`` model (Admin's w_skip Post-LN Transformer) and the ``transformer_lm_postln``
architecture (a Post-LN decoder-only language model), and ``--optimizer radam`` (torch's RAdam)."""
from ..quiet import hide_known_noise
from .compat import patch_fairseq_checkpoint_loading, patch_fairseq_numpy_compat

hide_known_noise()
patch_fairseq_checkpoint_loading()
patch_fairseq_numpy_compat()

from .task import TranslationGradInitConfig, TranslationGradInitTask, gradinit_config_from_task  # noqa: E402  (serves every task)
from .wskip import WSkipTransformerModel  # noqa: E402  (registers transformer_wskip)
from . import postln_lm  # noqa: E402,F401  (registers transformer_lm_postln)
from .radam import FairseqRAdam  # noqa: E402  (registers --optimizer radam)

__all__ = ["TranslationGradInitConfig", "TranslationGradInitTask", "WSkipTransformerModel", "gradinit_config_from_task", "FairseqRAdam"]
