"""Serve every fairseq task with GradInit: each registered task (and each one registered later) is
replaced by a subclass with :class:`~.hook.GradInitTaskMixin` whose config adds the
``--gradinit-*`` fields to the task's own. GradInit stays off unless ``--gradinit-iters`` > 0 (or
``--gradinit-init-file``), so runs without those options are unchanged.

Tasks that declare their options with ``add_args`` only (fairseq's legacy tasks, no dataclass)
accept the ``--gradinit-*`` flags and refuse them, with an argument error, when GradInit or the
training monitor is on.
"""
import dataclasses
import logging
from typing import Dict, Optional, Tuple

import fairseq.tasks as fairseq_tasks
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.tasks import TASK_CLASS_NAMES, TASK_DATACLASS_REGISTRY, TASK_REGISTRY

from ..settings.options import GradInitOptions
from ..settings.plan import legacy_task_parse_error
from ..settings.validation import check_when_parsed
from .hook import GradInitTaskMixin

logger = logging.getLogger(__name__)

# Classes this module made or was given, so that serving twice changes nothing.
_SERVED: Dict[type, type] = {}


def config_with_gradinit(base: type) -> type:
    """A dataclass extending the task config ``base`` with the ``--gradinit-*`` fields."""
    if issubclass(base, GradInitOptions):
        return base
    name = f"{base.__name__}WithGradInit"
    cls = type(name, (GradInitOptions, base), {"__module__": __name__, "__qualname__": name,
                                                 "__doc__": f"{base.__name__} with the --gradinit-* options."})
    return dataclasses.dataclass(cls)


def task_with_gradinit(task_cls: type, config: Optional[type]) -> type:
    """``task_cls`` with GradInit; ``config`` is its dataclass (None: a legacy add_args task)."""
    if issubclass(task_cls, GradInitTaskMixin):
        return task_cls
    name = f"{task_cls.__name__}WithGradInit"
    if config is None:
        attrs = {"add_args": classmethod(_legacy_add_args)}
        sub = type(name, (task_cls,), {"__module__": __name__, "__qualname__": name, **attrs})
    else:
        sub = type(name, (GradInitTaskMixin, task_cls), {"__module__": __name__, "__qualname__": name})
        # fairseq reads a task's dataclass from this attribute (FairseqTask.add_args); no name mangling.
        setattr(sub, "__dataclass", config)
    sub.__doc__ = f"fairseq's {task_cls.__name__} served by the fairseq_gradinit plugin."
    return sub


def _legacy_add_args(cls, parser):
    super(cls, cls).add_args(parser)
    group = parser.add_argument_group("GradInit (not available for this task)")
    gen_parser_from_dataclass(group, GradInitOptions())
    check_when_parsed(parser, legacy_task_parse_error)


def serve(name: str, task_cls: type, config: Optional[type], *, served: Optional[Tuple[type, type]] = None) -> type:
    """Register the GradInit version of task ``name`` in fairseq's registries (and hydra's
    ConfigStore, against which fairseq validates the parsed options). ``served``: the
    (task, config) pair to use instead of generated ones."""
    if task_cls in _SERVED.values():
        return task_cls
    if served is not None:
        sub, dc = served
    else:
        dc = config_with_gradinit(config) if config is not None else None
        sub = task_with_gradinit(task_cls, dc)
    _SERVED[task_cls] = sub
    TASK_REGISTRY[name] = sub
    TASK_CLASS_NAMES.add(sub.__name__)
    if dc is not None:
        from hydra.core.config_store import ConfigStore

        TASK_DATACLASS_REGISTRY[name] = dc
        node = dc()
        node._name = name
        ConfigStore.instance().store(name=name, group="task", node=node, provider="fairseq")
    return sub


def serve_all_tasks(special: Dict[type, Tuple[type, type]]) -> int:
    """Serve every task registered now and wrap ``register_task`` so tasks registered later (other
    ``--user-dir`` plugins) are served too. ``special``: task class -> (task, config) to use for it.
    Returns how many tasks were served now."""
    count = 0
    for name, cls in list(TASK_REGISTRY.items()):
        if cls in _SERVED.values() or issubclass(cls, GradInitTaskMixin):
            continue
        serve(name, cls, TASK_DATACLASS_REGISTRY.get(name), served=special.get(cls))
        count += 1
    if not getattr(fairseq_tasks.register_task, "_gradinit_serves", False):
        fairseq_tasks.register_task = _serving_register_task(fairseq_tasks.register_task)
    return count


def _serving_register_task(register_task):
    def register(name, dataclass=None):
        decorate = register_task(name, dataclass=dataclass)

        def wrap(cls):
            out = decorate(cls)
            if TASK_REGISTRY.get(name) is cls:  # newly registered (fairseq returns the old one otherwise)
                serve(name, cls, dataclass)
            return out

        return wrap

    register._gradinit_serves = True
    register.__doc__ = register_task.__doc__
    return register
