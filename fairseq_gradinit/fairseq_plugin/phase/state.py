"""The GradInit phase's state in ``--save-dir``, so that a stopped or killed phase resumes.

Every ``--gradinit-checkpoint-interval`` iterations rank 0 writes ``gradinit.state.pt`` (the scales,
their Adam moments, the history and every rank's torch random state: a few kilobytes) with this run's
fingerprint. The same command started again finds it and continues after its last iteration, drawing
the same batches (and, with ``--gradinit-dropout true``, the same dropout masks) from there; the file
is removed once ``gradinit.json`` is written.
"""
import logging
import os
import tempfile
from typing import Optional

import torch

from ...core.random_state import random_state_problem

logger = logging.getLogger(__name__)

STATE_FILE = "gradinit.state.pt"


def state_path(save_dir: str) -> str:
    return os.path.join(save_dir, STATE_FILE)


def save_phase_state(path: str, state: dict, fingerprint: Optional[dict]) -> None:
    """Write ``state`` (``GradInit.state_dict()``) and ``fingerprint`` atomically to ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gradinit.state.", suffix=".pt", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"state": state, "fingerprint": fingerprint}, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


#: The fields of a saved phase state (``GradInit.state_dict()``) and their types; None allowed for the optional
#: ones (``rng`` is missing in states saved before it existed: they resume, exactly only without dropout).
STATE_FIELDS = {"format": int, "names": list, "w_sq_norms": list, "config": dict, "alpha": torch.Tensor,
                "adam": dict, "history": list, "consecutive_skips": int, "last_branch": str}
OPTIONAL_STATE_FIELDS = {"adam_constraint": dict, "gamma": (int, float), "rng": dict}


def state_problem(state, fingerprint) -> Optional[str]:
    """Which field of a loaded phase state is missing or of another type, or None."""
    if not isinstance(state, dict):
        return f"its state is a {type(state).__name__}, not the dict of GradInit.state_dict()"
    if fingerprint is not None and not isinstance(fingerprint, dict):
        return f"its fingerprint is a {type(fingerprint).__name__}, not a dict"
    for key, typ in STATE_FIELDS.items():
        if not isinstance(state.get(key), typ):
            return f"its field {key!r} is {type(state.get(key)).__name__}, not {getattr(typ, '__name__', typ)}"
    for key, typ in OPTIONAL_STATE_FIELDS.items():
        if state.get(key) is not None and not isinstance(state[key], typ):
            return f"its field {key!r} is {type(state[key]).__name__}"
    if not all(isinstance(r, dict) for r in state["history"]):
        return "its history holds entries that are not dicts"
    if state.get("rng") is not None:
        return random_state_problem(state["rng"])
    return None


def load_phase_state(path: str, fingerprint: Optional[dict], diff) -> Optional[dict]:
    """The saved ``GradInit.state_dict()`` at ``path`` if it exists and was written by this run
    (``diff(saved_fingerprint, fingerprint)`` empty), else None; ``ValueError`` saying what to do
    when it belongs to another run or cannot be read."""
    if not os.path.exists(path):
        return None
    advice = f"delete {path} to start GradInit anew, or use another --save-dir"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        state, saved_fp = saved["state"], saved["fingerprint"]
        problem = state_problem(state, saved_fp)
        if problem:
            raise ValueError(problem)
    except Exception as e:  # a truncated or foreign file: say so instead of a traceback
        raise ValueError(f"{path} is not a readable GradInit phase state ({type(e).__name__}: {e}); {advice}") from None
    differences = diff(saved_fp, fingerprint) if fingerprint is not None else []
    if differences:
        raise ValueError(f"{path} was written by a different run ({'; '.join(differences)}); {advice}")
    return state
