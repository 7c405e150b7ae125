"""fairseq plugin: registers the ``translation_gradinit`` task, serves every fairseq task with the
``--gradinit-*`` options (``translation`` with ``translation_gradinit``), and registers the
``transformer_wskip`` model (Admin's w_skip Post-LN Transformer) and the ``transformer_lm_postln``
architecture (a Post-LN decoder-only language model), in :mod:`.models`, and ``--optimizer radam``
(torch's RAdam), in :mod:`.optim`.

The GradInit adapter is in rooms by concern, each importing only the rooms below it:
:mod:`.analysis` (the per-layer report) > :mod:`.registration` (what fairseq calls) > :mod:`.models`,
:mod:`.optim` > :mod:`.phase` (the phase and its files) > :mod:`.settings` (options, plan, checks) >
:mod:`.features` (tied per-use scales, the monitor, the attention guard, the health report) >
:mod:`.data` (fairseq data glue) > :mod:`.errors` (the one error type). ``pyproject.toml``'s import
contracts hold that order."""
from ..command_line.quiet import hide_known_noise
from .registration.compat import patch_fairseq_checkpoint_loading, patch_fairseq_numpy_compat

hide_known_noise()
patch_fairseq_checkpoint_loading()
patch_fairseq_numpy_compat()

from .registration.task import TranslationGradInitConfig, TranslationGradInitTask, gradinit_config_from_task  # noqa: E402  (serves every task)
from .models import WSkipTransformerModel  # noqa: E402  (registers transformer_wskip, transformer_lm_postln)
from .optim import FairseqRAdam  # noqa: E402  (registers --optimizer radam)

__all__ = ["TranslationGradInitConfig", "TranslationGradInitTask", "WSkipTransformerModel", "gradinit_config_from_task", "FairseqRAdam"]
