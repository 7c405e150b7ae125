"""The models and architectures the plugin registers with fairseq: ``transformer_wskip`` (Admin's
w_skip Post-LN Transformer, :mod:`.wskip`) and ``transformer_lm_postln`` (a Post-LN decoder-only
language model, :mod:`.postln_lm`). They use nothing of the GradInit adapter but its public
argument-check registration (:func:`~fairseq_gradinit.fairseq_plugin.settings.validation.check_every_parse`)."""
from . import postln_lm  # noqa: F401  (registers transformer_lm_postln)
from .wskip import WSkipTransformerModel  # noqa: F401  (registers transformer_wskip)
