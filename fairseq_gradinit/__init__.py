"""fairseq_gradinit: GradInit (Zhu et al., NeurIPS 2021) for fairseq and any PyTorch model.

``fairseq_gradinit.core`` (the engine) and ``fairseq_gradinit.vision`` never import fairseq.
The fairseq task is registered when this package is loaded by fairseq (``--user-dir``) or when
``fairseq_gradinit.fairseq_plugin`` is imported.
"""
import sys

__version__ = "0.1.0"

if "fairseq" in sys.modules:  # loaded through fairseq's --user-dir: register our task
    from . import fairseq_plugin  # noqa: F401,E402
