"""The dictionaries a model was trained with, recorded in its checkpoint and checked when it is loaded.

A data-bin whose dictionary has the same size but other words loads without an error and maps every
word id to another word: nonsense translations, or training on mismatched ids after a resume. The
task records a digest of each dictionary's symbols in the checkpoint's ``task_state``; loading the
checkpoint (fairseq-generate, fairseq-validate, ``load_model_ensemble_and_task``) and resuming
training compare it with the dictionaries of the data-bin in use.
"""
from __future__ import annotations

import hashlib
from typing import Dict, Mapping, Optional

#: The key in the checkpoint's ``task_state``.
DICTIONARIES_KEY = "gradinit_dictionaries"
ROLES = ("source_dictionary", "target_dictionary")


def dictionary_digests(task) -> Dict[str, dict]:
    """``{role: {"size", "sha256"}}`` of the task's source and target dictionaries (the symbols in
    id order: what a word id means)."""
    out = {}
    for role in ROLES:
        try:
            dictionary = getattr(task, role)
        except (AttributeError, NotImplementedError):
            continue
        symbols = getattr(dictionary, "symbols", None)
        if symbols is None:
            continue
        digest = hashlib.sha256("\n".join(map(str, symbols)).encode("utf-8")).hexdigest()
        out[role] = {"size": len(symbols), "sha256": digest}
    return out


def dictionary_mismatch(saved: Optional[Mapping], current: Mapping, *, data: str = "the data-bin") -> Optional[str]:
    """Why the dictionaries ``saved`` with a checkpoint are not those of ``current``, or None
    (also when the checkpoint recorded none)."""
    if not isinstance(saved, Mapping):
        return None
    for role in ROLES:
        old, new = saved.get(role), current.get(role)
        if not isinstance(old, Mapping) or new is None or old.get("sha256") == new["sha256"]:
            continue
        what = role.split("_")[0]
        size = (f"the same size ({new['size']} symbols) but other words" if old.get("size") == new["size"] else
                f"{new['size']} symbols instead of {old.get('size')}")
        return (f"the {what} dictionary of {data} is not the one the model was trained with ({size}): its word ids "
                "would mean other words. Use the data-bin the model was trained on")
    return None
