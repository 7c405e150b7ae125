"""The ``translation_gradinit`` task, and GradInit for every fairseq task at plugin load.

The pieces live in their own modules: the option fields (:mod:`.options`), their translation
into a ``GradInitConfig`` (:mod:`..settings.option_values`), every check (:mod:`..settings.validation`) and its error
(:mod:`..errors`), a run's settings resolved once (:mod:`..settings.plan`), the checkpoint-restore rule
(:mod:`..settings.restore`), the run handed to the phase (:mod:`.run`), the task hook (:mod:`.hook`) and the
registry replacement (:mod:`.registry`).
The names below stay importable from here.
"""
import logging
from dataclasses import dataclass

from fairseq.tasks import TASK_REGISTRY, register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..data.loss import mean_loss_fn
from ..errors import GradInitError, GradInitStop
from ..phase.run import GRADINIT_JSON
from ..phase.run_log import LOG_LEVEL_ENV, quiet_fairseq_printouts
from ..settings.option_values import gradinit_config_from_task, parse_scale_bounds, read_init_file
from ..settings.options import GradInitOptions
from ..settings.plan import RunPlan, build_plan, namespace_error
from ..settings.restore import restore_source, will_restore_checkpoint
from ..settings.validation import gradinit_option_error, unsupported_setup_error
from .hook import GradInitTaskMixin
from .registry import serve_all_tasks

logger = logging.getLogger(__name__)

__all__ = [
    "GRADINIT_JSON", "GradInitError", "GradInitOptions", "RunPlan", "GradInitStop", "GradInitTaskMixin", "TranslationGradInitConfig",
    "TranslationGradInitTask", "build_plan", "gradinit_config_from_task", "gradinit_option_error", "mean_loss_fn",
    "namespace_error", "parse_scale_bounds", "read_init_file", "restore_source", "unsupported_setup_error",
    "will_restore_checkpoint",
]


@dataclass
class TranslationGradInitConfig(GradInitOptions, TranslationConfig):
    """fairseq's translation options and the ``--gradinit-*`` options."""


@register_task("translation_gradinit", dataclass=TranslationGradInitConfig)
class TranslationGradInitTask(GradInitTaskMixin, TranslationTask):
    """Translation with GradInit (``--gradinit-iters N``) before the first update."""

    cfg: TranslationGradInitConfig


def _log_changes_to_fairseq() -> None:
    """Say once, at load, what the plugin changes in fairseq (docs/fairseq.md lists both)."""
    from .compat import checkpoint_loading_patched, numpy_compat_patched

    changes = []
    if TASK_REGISTRY.get("translation") is TranslationGradInitTask:
        changes.append("task 'translation' is served by TranslationGradInitTask (identical unless "
                       "--gradinit-iters/--gradinit-init-file is given)")
    others = sum(1 for k, v in TASK_REGISTRY.items() if k not in ("translation", "translation_gradinit")
                 and v.__module__ == serve_all_tasks.__module__)
    if others:
        changes.append(f"the other {others} tasks accept the --gradinit-* options (identical without them)")
    if checkpoint_loading_patched():
        changes.append("fairseq's checkpoint loading passes torch.load(weights_only=False) "
                       "(load only checkpoints you trust)")
    if others or TASK_REGISTRY.get("translation") is TranslationGradInitTask:
        changes.append("checkpoints record their dictionaries (task_state), and loading or resuming one on a data-bin "
                       "with other dictionaries stops")
    if numpy_compat_patched():
        changes.append("np.compat.long, which numpy 2 removed, is int in fairseq's token-block and language-pair "
                       "datasets (--sample-break-mode eos, bucketed batches)")
    quiet_fairseq_printouts()
    changes.append("fairseq-train's printouts of the whole configuration and of the model are logged at the debug "
                   f"level ({LOG_LEVEL_ENV}=debug shows them)")
    logger.info("gradinit: plugin loaded; changes to fairseq: %d, one per line", len(changes))
    for change in changes:
        logger.info("gradinit: change to fairseq: %s", change)


# `fairseq-train DATA --user-dir fairseq_gradinit --gradinit-iters 780` (no --task) uses fairseq's
# default task "translation": it is served by TranslationGradInitTask, every other task by a
# generated subclass (registry.serve_all_tasks).
serve_all_tasks({TranslationTask: (TranslationGradInitTask, TranslationGradInitConfig)})
_log_changes_to_fairseq()
