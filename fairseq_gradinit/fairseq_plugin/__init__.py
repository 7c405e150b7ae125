"""fairseq plugin: registers the ``translation_gradinit`` task (and serves ``translation`` with it) and the
``transformer_wskip`` model (Admin's w_skip Post-LN Transformer)."""
from .compat import patch_fairseq_checkpoint_loading

patch_fairseq_checkpoint_loading()

from .task import TranslationGradInitConfig, TranslationGradInitTask, gradinit_config_from_task  # noqa: E402
from .wskip import WSkipTransformerModel  # noqa: E402  (registers transformer_wskip)
from .radam import FairseqRAdam  # noqa: E402  (registers --optimizer radam)

__all__ = ["TranslationGradInitConfig", "TranslationGradInitTask", "WSkipTransformerModel", "gradinit_config_from_task", "FairseqRAdam"]
