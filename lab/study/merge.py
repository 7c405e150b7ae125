"""A second study into the ``--out`` of an earlier one (e.g. to rerun the arms that did not run): its arms
are merged with the earlier arms, so that ``study.json``, ``curves.*`` and ``bleu.json`` hold them all.
Arms of the same name are this study's; the others keep what the earlier study recorded. Settings that
make the arms comparable (updates, intervals, base arguments, data, BLEU split and references) must be
the same, else the study is refused before it runs."""
from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from .plan import StudyConfig

logger = logging.getLogger(__name__)

#: ``study.json``'s keys that every version of the study runner writes.
STUDY_KEYS = ("out", "data", "base", "settings", "arms")
#: Settings an earlier study must share with this one for its arms to be merged.
SHARED_SETTINGS = ("max_update", "valid_every", "save_every", "cpu")


def earlier_study(cfg: StudyConfig) -> Optional[dict]:
    """The ``study.json`` already in ``--out`` (None if there is none), checked to be a study's and to have
    this study's settings (ValueError naming the difference otherwise)."""
    path = Path(cfg.out) / "study.json"
    if not path.is_file():
        return None
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(earlier, dict) or not all(k in earlier for k in STUDY_KEYS) or \
                not isinstance(earlier["arms"], dict) or not isinstance(earlier["settings"], dict):
            raise ValueError(f"it lacks {[k for k in STUDY_KEYS if k not in earlier] if isinstance(earlier, dict) else STUDY_KEYS}")
    except (OSError, ValueError) as e:
        raise ValueError(f"--out {cfg.out} holds {path}, which is not a study.json of this study runner "
                         f"({type(e).__name__}: {e}); use another --out, or move that file away") from None
    ours = {"max_update": cfg.max_update, "valid_every": cfg.valid_every, "save_every": cfg.save_every, "cpu": cfg.cpu}
    differ = [f"{k} {earlier['settings'].get(k)} -> {ours[k]}" for k in SHARED_SETTINGS
              if earlier["settings"].get(k) != ours[k]]
    if earlier.get("data", {}).get("main") != str(cfg.data["main"]):
        differ.append(f"data-bin {earlier.get('data', {}).get('main')} -> {cfg.data['main']}")
    if earlier.get("base") != shlex.join(cfg.base):
        differ.append(f"base arguments {earlier.get('base')!r} -> {shlex.join(cfg.base)!r}")
    bleu = earlier.get("bleu")
    if cfg.bleu and isinstance(bleu, dict):
        if bleu.get("subset") != cfg.bleu_subset or bleu.get("reference") != (cfg.bleu_ref or "T- lines"):
            differ.append(f"BLEU on {bleu.get('subset')} against {bleu.get('reference')} -> {cfg.bleu_subset} "
                          f"against {cfg.bleu_ref or 'T- lines'}")
    if differ:
        raise ValueError(f"--out {cfg.out} holds a study with other settings ({'; '.join(differ)}): its arms and "
                         "this study's would not be comparable in one table; use another --out, or the earlier "
                         "settings to add arms to it")
    return earlier


def earlier_arms(earlier: Optional[Mapping], names_now) -> Dict[str, Any]:
    """The earlier study's arms that this study does not run again."""
    return {n: a for n, a in (earlier or {}).get("arms", {}).items() if n not in set(names_now)}


def merge_results(earlier: Optional[Mapping], result: Dict[str, Any]) -> Dict[str, Any]:
    """``result`` (this study's ``study.json``) with the earlier study's other arms, GradInit groups and BLEU
    scores added; each BLEU score keeps the update of its checkpoint."""
    if not earlier:
        return result
    kept = earlier_arms(earlier, result["arms"])
    merged = dict(result, arms={**kept, **result["arms"]},
                  gradinit_groups={**(earlier.get("gradinit_groups") or {}), **result["gradinit_groups"]},
                  merged_arms=sorted(kept))
    merged["bleu"] = merge_bleu(earlier.get("bleu"), result.get("bleu"), kept)
    if kept:
        logger.info("study: merged with the earlier study in %s (its arms %s)", result["out"], ", ".join(sorted(kept)))
    return merged


def merge_bleu(earlier: Optional[Mapping], now: Optional[Mapping], kept: Mapping) -> Optional[dict]:
    if not isinstance(earlier, dict) or not isinstance(now, dict):
        return now if now is not None else earlier
    arms = {n: dict(e, update=earlier.get("update")) for n, e in (earlier.get("arms") or {}).items() if n in kept}
    arms.update({n: dict(e, update=now.get("update")) for n, e in (now.get("arms") or {}).items()})
    updates = {e["update"] for e in arms.values() if e.get("bleu") is not None}
    # one update for the table only when every score is at it; else each entry says its own
    update = now.get("update") if not updates else (updates.pop() if len(updates) == 1 else None)
    return dict(now, arms=arms, update=update)
