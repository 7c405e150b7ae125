"""fairseq_gradinit: GradInit (Zhu et al., NeurIPS 2021) for fairseq and any PyTorch model.

``fairseq_gradinit.core`` (the engine) and ``fairseq_gradinit.vision`` never import fairseq.
The fairseq task is registered when this package is loaded while fairseq is imported (fairseq's
``--user-dir`` imports it so) or when ``fairseq_gradinit.fairseq_plugin`` is imported.
"""
import sys

from .version import __version__  # noqa: F401

# `sys.modules["fairseq"] = None` is the usual way to keep fairseq out: it is not "loaded".
if sys.modules.get("fairseq") is not None:  # e.g. fairseq's --user-dir: register our task
    from . import fairseq_plugin  # noqa: F401,E402
