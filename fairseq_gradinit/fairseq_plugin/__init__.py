"""fairseq plugin: registers the ``translation_gradinit`` task (and serves ``translation`` with it)."""
from .compat import patch_fairseq_checkpoint_loading

patch_fairseq_checkpoint_loading()

from .task import TranslationGradInitConfig, TranslationGradInitTask, gradinit_config_from_task  # noqa: E402

__all__ = ["TranslationGradInitConfig", "TranslationGradInitTask", "gradinit_config_from_task"]
