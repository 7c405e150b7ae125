"""``--gradinit-init-file``: reading a saved ``gradinit.json`` and checking that applying it makes sense.

An init file replaces the computation, so settings that only say how scales are computed would be
ignored; they are refused together with it rather than silently dropped. Its scales must be usable:
a negative scale flips a tensor's sign and is refused always; a zero scale is refused for every
tensor except biases (named ``*.bias``), which the authors' bounds ``('bias', 0, None)`` let GradInit
drive to exactly 0 and which then start at zero as fairseq's own biases do.
"""

import dataclasses
import hashlib
import json
import os
from typing import Mapping, Optional

import torch

from ...core.errors import OptionValueError
from ...core.scales import scales_error


def compute_only_options() -> tuple:
    """``--gradinit-*`` settings (field names) that only affect how scales are computed, unused with an
    init file: the engine's options that change the result, and the GradInit batch size. Derived from
    the options' declaration (``result``), so a new option is covered without a list to update."""
    from .options import ENGINE_OPTIONS

    return tuple("gradinit_" + s.name for s in ENGINE_OPTIONS if s.result) + ("gradinit_max_tokens",)


def compute_only_flags() -> tuple:
    """:func:`compute_only_options` as command-line flags."""
    return tuple("--" + n.replace("_", "-") for n in compute_only_options())


def compute_only_defaults(config_class) -> dict:
    """The defaults of :func:`compute_only_options` in the dataclass ``config_class``."""
    names = compute_only_options()
    return {f.name: f.default for f in dataclasses.fields(config_class) if f.name in names}


def read_init_file(path: str, *, flag: str = "--gradinit-init-file") -> dict:
    """The saved GradInit result at ``path``; :class:`~fairseq_gradinit.core.errors.OptionValueError`
    ('FLAG PATH: REASON') if it is missing, not JSON, or has no scales that
    :func:`~fairseq_gradinit.core.scales_error` accepts (the one check of every file of scales, whoever reads it)."""

    def refused(reason: str) -> OptionValueError:
        return OptionValueError(flag, f"{path}: {reason}", reason=reason)

    if not os.path.isfile(path):
        raise refused("no such file")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refused(f"not a JSON file ({e})") from None
    scales = saved.get("scales") if isinstance(saved, dict) else None
    if not isinstance(scales, dict) or not scales:
        raise refused("has no 'scales' (expected the gradinit.json that a --gradinit-iters run writes into its "
                      "--save-dir)")
    # the plugin applies them to the fp32 model it builds: a scale that float32 makes inf or 0 is refused here
    error = scales_error(scales, torch.float32) or field_problem(saved)
    if error:
        raise refused(error)
    return saved


#: The fields of a ``gradinit.json`` that its readers use, and what each holds where present (None allowed).
FIELD_TYPES = {"fingerprint": dict, "clamped_from": dict, "config": dict, "gamma": (int, float), "history": list,
               "health": dict, "summary": dict, "uses": dict, "max_tokens": int}


def field_problem(saved: Mapping) -> Optional[str]:
    """Which field of the ``gradinit.json`` ``saved`` is not what its readers expect ('its field
    'fingerprint' is a list, not an object ...'), or None."""
    names = {dict: "an object", list: "a list", int: "an integer", (int, float): "a number"}
    for key, typ in FIELD_TYPES.items():
        value = saved.get(key)
        if value is not None and (not isinstance(value, typ) or isinstance(value, bool)):
            return (f"its field {key!r} is {type(value).__name__} {repr(value)[:40]}, not {names[typ]} (was the "
                    "file edited?); use the gradinit.json a --gradinit-iters run wrote")
    if isinstance(saved.get("history"), list) and not all(isinstance(r, dict) for r in saved["history"]):
        return "its field 'history' holds entries that are not objects (was the file edited?)"
    return None


def clamped_init_file(model, path: str, saved: dict, clamp: str) -> dict:
    """The init file ``saved`` (read from ``path``) with its scales clamped into the bounds of the
    ``--gradinit-init-clamp`` text ``clamp``, as a record of its own: a ``clamped_from`` record that
    keeps the source's fingerprint (its scales still fit that run's weights) and no fingerprint of
    its own, since no GradInit run computed these scales: a later ``--gradinit-iters`` run into the
    folder must not take them for its result."""
    from ...core.options import parse_scale_bounds
    from ...core.scales import clamp_scales

    bounds = parse_scale_bounds(clamp, flag="--gradinit-init-clamp")
    out = clamp_scales(model, saved["scales"], bounds)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    dropped = ("scales", "history", "health", "summary", "clamped_from", "fingerprint")
    record = {k: v for k, v in saved.items() if k not in dropped}
    record.update(scales=out["scales"], clamped_from={
        "path": os.path.abspath(path), "sha256": digest, "bounds": [list(b.to_list()) for b in bounds],
        "changed": out["changed"], "fingerprint": source_fingerprint(saved), "previous": saved.get("clamped_from")})
    return record


def source_fingerprint(saved: Mapping) -> Optional[dict]:
    """The fingerprint of the run whose weights the scales of ``saved`` fit: its own, or for a
    ``--gradinit-init-clamp`` record, that of the file it was clamped from."""
    clamped = saved.get("clamped_from")
    if isinstance(clamped, Mapping):
        return clamped.get("fingerprint") or saved.get("fingerprint")
    return saved.get("fingerprint")


def clamp_target_error(existing: Mapping, record: Mapping, path: str) -> Optional[str]:
    """Why the clamped ``record`` cannot go to ``path``, which holds ``existing`` (a gradinit.json is
    never overwritten), or None when it already holds the same clamped scales (the same command again)."""
    mine, theirs = record["clamped_from"], existing.get("clamped_from")
    if isinstance(theirs, Mapping) and existing.get("scales") == record["scales"] and \
            (theirs.get("sha256"), theirs.get("bounds")) == (mine["sha256"], mine["bounds"]):
        return None
    what = (f"scales clamped from {theirs.get('path')} with the bounds {theirs.get('bounds')}"
            if isinstance(theirs, Mapping) else "another run's GradInit result")
    return (f"--gradinit-init-clamp: {path} exists and holds {what}; the clamped scales of this run are written "
            f"there and a gradinit.json is never overwritten: use another --save-dir, or delete {path}")


def unscaled_tensors(model, scales: Mapping[str, float], config: Optional[Mapping] = None) -> list:
    """First names of the ``model``'s tensors that GradInit scales (trainable and not all zeros) but
    that ``scales`` has no scale for under any of their names: a file edited by hand, or computed for
    a model with more tensors. Empty for a file computed with its own ``param_filter``."""
    if isinstance(config, Mapping) and config.get("param_filter") is not None:
        return []
    tensors: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tensors.setdefault(id(p), (p, []))[1].append(name)
    return [names[0] for p, names in tensors.values()
            if p.requires_grad and not any(n in scales for n in names) and bool(p.detach().count_nonzero())]


def saved_gamma(saved: Mapping) -> Optional[float]:
    """The gamma a saved ``gradinit.json`` ran with (``gamma``, else its config's ``resolved_gamma``)."""
    gamma = saved.get("gamma")
    return gamma if gamma is not None else (saved.get("config") or {}).get("resolved_gamma")
