"""What determines a GradInit result: the fingerprint stored in ``gradinit.json``.

A fingerprint is a JSON-ready dict of everything that changes the learned scales: the model's
arguments, the criterion, ``--seed``, the training data, the data-parallel world size and the
resolved GradInit settings, plus the package version (recorded, not compared). The data part is
portable: it names files relative to their data directory and records sizes and SHA-256 hashes of
the dictionaries and the train split's ``.idx`` files (the ``.bin`` files by size only), never
absolute paths or modification times, so a data-bin copied to another machine still matches.

Two entry points give the same dict:

- :func:`gradinit_fingerprint` from the full fairseq config ``fairseq-train`` builds;
- :func:`fingerprint_from_args` from a ``fairseq-train`` argument list, without building a model.

The fingerprint records fairseq's own model, task and criterion config, so this module reads
fairseq's settings as they come (:func:`~..data.cfg.cfg_value`); GradInit's own come from the plan.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ...core.options import result_options
from ...version import __version__
from ..data.cfg import cfg_value
from ..settings.options import RESULT_GLOBAL_SETTINGS, plugin_result_options
from ..settings.plan import RunPlan, build_plan

#: Fingerprint keys that must agree for a saved result to be reused as if computed now.
COMPARED_KEYS = ("model", "criterion", "seed", "data", "world_size", "gradinit")
#: Keys whose disagreement makes ``--gradinit-init-file`` scales apply to different weights or data.
INIT_FILE_KEYS = ("model", "seed", "data")

# Task options that decide which sentences GradInit sees and how they are batched.
_DATA_TASK_KEYS = (
    "source_lang", "target_lang", "train_subset", "dataset_impl", "left_pad_source", "left_pad_target",
    "max_source_positions", "max_target_positions", "upsample_primary", "truncate_source",
    "num_batch_buckets", "required_seq_len_multiple", "load_alignments",
)
# The same for other tasks (language modeling, masked LM, sentence prediction); recorded only when
# set, so that translation fingerprints stay as they were.
_OTHER_DATA_TASK_KEYS = (
    "tokens_per_sample", "sample_break_mode", "output_dictionary_size", "self_target", "future_target",
    "past_target", "add_bos_token", "shorten_method", "shorten_data_split_list", "pad_to_fixed_length",
    "mask_prob", "leave_unmasked_prob", "random_token_prob", "mask_whole_words", "mask_multiple_length",
    "num_classes", "separator_token", "init_token", "max_positions",
)
_HASH_CHUNK = 1 << 20


def gradinit_fingerprint(cfg, *, plan: Optional[RunPlan] = None) -> Dict[str, Any]:
    """The fingerprint of the GradInit run a full fairseq config describes.

    ``cfg`` is the omegaconf config of ``fairseq-train`` (``convert_namespace_to_omegaconf``);
    it reads ``cfg.task``, ``cfg.model``, ``cfg.criterion`` (when present), ``cfg.common.seed``
    and ``cfg.distributed_training.distributed_world_size``. Pass it before a model is built from
    it: fairseq writes derived model arguments (e.g. ``share_decoder_input_output_embed`` under
    ``--share-all-embeddings``) into a legacy architecture's namespace while building. ``plan``: the run's
    plan where the caller has one (a task's), else resolved from ``cfg.task`` (a command line without a task).
    """
    return fingerprint(
        task_cfg=cfg.task, model_cfg=cfg.model, criterion_cfg=cfg_value(cfg, "criterion"),
        seed=cfg.common.seed, world_size=cfg.distributed_training.distributed_world_size,
        plan=plan if plan is not None else build_plan(cfg.task),
    )


def fingerprint_from_args(argv: Sequence[str]) -> Dict[str, Any]:
    """:func:`gradinit_fingerprint` of a ``fairseq-train`` argument list (``--user-dir`` included).

    Parses ``argv`` with fairseq's own training parser, as ``fairseq-train`` does, and builds no
    model and loads no data (it reads the data directory's files to hash them). A bad argument
    exits like ``fairseq-train`` does (``SystemExit(2)``).
    """
    from ..data.training import training_config

    return gradinit_fingerprint(training_config(argv, defaults=True))


def fingerprint(*, task_cfg, model_cfg, criterion_cfg, seed, world_size, plan: RunPlan,
                model_args: Optional[Mapping] = None) -> Dict[str, Any]:
    """The fingerprint from its parts (what the task calls with its own config nodes) and the
    run's resolved GradInit settings ``plan``.

    ``model_args``: :func:`model_arguments` taken earlier, in place of ``model_cfg`` (fairseq
    fills in derived model arguments while it builds the model).
    """
    return {
        "version": __version__,
        "model": _plain(model_args) if model_args is not None else model_arguments(model_cfg),
        "criterion": _plain(_container(criterion_cfg)) if criterion_cfg is not None else None,
        "seed": int(seed) if seed is not None else None,
        "world_size": int(world_size),
        "data": data_fingerprint(task_cfg),
        "gradinit": gradinit_settings(plan),
    }


def fingerprint_diff(saved: Optional[Mapping], current: Mapping, keys: Sequence[str] = COMPARED_KEYS,
                     limit: int = 6) -> List[str]:
    """Dotted paths where ``saved`` and ``current`` differ under ``keys`` (at most ``limit``).

    A ``saved`` of ``None`` (a ``gradinit.json`` written before fingerprints existed) differs
    everywhere: ``["fingerprint (none recorded)"]``.
    """
    if not saved:
        return ["fingerprint (none recorded)"]
    out: List[str] = []

    def walk(a, b, path):
        if len(out) >= limit:
            return
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}" if path else str(k))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}.{i}")
        elif a != b and not (a == "<absent>" and _added_later_at_default(path, b)):
            out.append(f"{path}: {_short(a)} -> {_short(b)}")

    for key in keys:
        walk(saved.get(key, "<absent>"), current.get(key, "<absent>"), key)
    return out


# -- parts --------------------------------------------------------------------------------------
def model_arguments(model_cfg) -> Dict[str, Any]:
    """The model's own arguments, JSON-ready.

    fairseq hands legacy architectures (e.g. ``transformer_iwslt_de_en``) the whole command-line
    namespace; keep only what the architecture declares (its ``add_args``) plus ``arch``.
    """
    if isinstance(model_cfg, argparse.Namespace):
        from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

        arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
        cls = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)
        if cls is None:
            raise ValueError(f"unknown --arch {arch!r}: cannot tell which arguments belong to the model")
        parser = argparse.ArgumentParser(add_help=False)
        cls.add_args(parser)
        keys = {a.dest for a in parser._actions if a.dest != argparse.SUPPRESS}
        out = {k: getattr(model_cfg, k) for k in sorted(keys) if hasattr(model_cfg, k)}
        out["arch"] = arch
        return _plain(out)
    return _plain(_container(model_cfg))


def data_fingerprint(task_cfg) -> Dict[str, Any]:
    """Task options that pick GradInit's sentences, and each data directory's dictionaries and
    train split: ``{file name: {"size", "sha256"}}`` (``.bin`` files: size only)."""
    split = cfg_value(task_cfg, "train_subset") or cfg_value(task_cfg, "gradinit_train_subset") or "train"
    out: Dict[str, Any] = {k: _plain(cfg_value(task_cfg, k)) for k in _DATA_TASK_KEYS}
    for k in _OTHER_DATA_TASK_KEYS:
        value = cfg_value(task_cfg, k)
        if value is not None:
            out[k] = _plain(value)
    data = cfg_value(task_cfg, "data")
    dirs = [d for d in str(data).split(os.pathsep) if d] if data else []
    out["dirs"] = [_dir_files(d, split) for d in dirs]
    if dirs and out["source_lang"] is None and out["target_lang"] is None and os.path.isdir(dirs[0]):
        # What TranslationTask.setup_task infers (and then writes into the task config).
        from fairseq.data import data_utils

        out["source_lang"], out["target_lang"] = data_utils.infer_language_pair(dirs[0])
    return out


def _added_later_at_default(path: str, value: Any) -> bool:
    """Whether ``path`` names an engine setting (``gradinit.resolved.NAME``) added by a later version
    (``since``) and ``value`` is its default: a fingerprint written before the setting existed was
    computed with that default."""
    import dataclasses

    from ...core import GradInitConfig

    prefix = "gradinit.resolved."
    if not path.startswith(prefix):
        return False
    field = GradInitConfig.__dataclass_fields__.get(path[len(prefix):])
    return (field is not None and bool(field.metadata.get("since")) and field.default is not dataclasses.MISSING
            and _plain(field.default) == value)


def _plugin_option_added_later_at_default(name: str, value: Any) -> bool:
    """Whether a plugin option added by a later version (``since``) sits at its default: left out of the
    fingerprint, so that results saved before it existed (computed with that default) still match."""
    import dataclasses

    from ..settings.options import PluginOptions

    field = PluginOptions.__dataclass_fields__.get(name)
    return (field is not None and bool(field.metadata.get("since")) and field.default is not dataclasses.MISSING
            and _plain(field.default) == _plain(value))


def stable_fingerprint(fp: Mapping) -> Dict[str, Any]:
    """``fp`` without the engine settings that later versions added and that sit at their default,
    so that a key derived from it (a study's GradInit cache) stays what earlier versions computed."""
    gradinit = fp.get("gradinit")
    if not isinstance(gradinit, Mapping) or not isinstance(gradinit.get("resolved"), Mapping):
        return dict(fp)
    resolved = {k: v for k, v in gradinit["resolved"].items()
                if not _added_later_at_default("gradinit.resolved." + k, v)}
    return {**fp, "gradinit": {**gradinit, "resolved": resolved}}


def gradinit_settings(plan: RunPlan) -> Dict[str, Any]:
    """What of the ``--gradinit-*`` options changes the result, resolved (``eta`` from ``--lr``,
    ``optimizer`` from ``--optimizer``, ``gamma`` from eta, tokens per iteration from
    ``--max-tokens``), so that a default and the same value given explicitly agree. Which options
    change the result is declared with them (``result`` of :func:`~fairseq_gradinit.core.config.option`);
    fairseq's settings that change GradInit's batches are :data:`~..settings.options.RESULT_GLOBAL_SETTINGS`.
    ``plan``: the run's :class:`~..settings.plan.RunPlan`."""
    if plan.config is not None:
        config = plan.config.to_dict()
        resolved = {k: config[k] for k in result_options()}
        resolved["resolved_gamma"] = config["resolved_gamma"]
    else:  # e.g. GradInit off and --lr 0: nothing to resolve
        resolved = {"invalid": plan.config_error}
    given = plan.result_settings
    plugin = {name: _plain(given[name]) for name in plugin_result_options()
              if name != "gradinit_max_tokens" and not _plugin_option_added_later_at_default(name, given[name])}
    for name in RESULT_GLOBAL_SETTINGS:
        if given[name] is not None:  # recorded when set: fingerprints of runs without it stay as they were
            plugin[name] = _plain(given[name])
    return {"resolved": _plain(resolved), "plugin": plugin, "max_tokens": _plain(plan.max_tokens)}


# -- helpers ------------------------------------------------------------------------------------
def _dir_files(directory: str, split: str) -> Dict[str, Any]:
    if not os.path.isdir(directory):
        return {"missing": os.path.basename(os.path.normpath(directory))}
    # "train" also covers fairseq's extra shards "train1", "train2", ... (combine=True).
    split_re = re.compile(re.escape(split) + r"\d*\.")
    files = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        if name.startswith("dict.") and name.endswith(".txt") or split_re.match(name) and name.endswith(".idx"):
            files[name] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
        elif split_re.match(name) and name.endswith(".bin"):
            files[name] = {"size": os.path.getsize(path)}
    return files


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _container(node):
    if node is None or isinstance(node, (dict, list, str, int, float, bool)):
        return node
    if isinstance(node, argparse.Namespace):
        return vars(node)
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    if hasattr(node, "__dataclass_fields__"):
        return {k: cfg_value(node, k) for k in node.__dataclass_fields__}
    return node


def _plain(value):
    """JSON-ready: enums and other objects as strings, tuples as lists, keys sorted."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def _short(value, n: int = 60) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= n else text[:n - 3] + "..."
