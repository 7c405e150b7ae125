"""Reading fairseq config values that may be missing or unresolved."""
from __future__ import annotations


def cfg_value(cfg, key: str, default=None):
    """``cfg.key``, or ``default`` when it is absent, None, or an interpolation (``${...}``) that
    cannot resolve (e.g. a task config built outside ``fairseq-train``)."""
    try:
        value = getattr(cfg, key)
    except Exception:  # omegaconf raises its own errors for unresolvable interpolations
        return default
    if isinstance(value, str) and value.startswith("${"):
        return default
    return default if value is None else value
