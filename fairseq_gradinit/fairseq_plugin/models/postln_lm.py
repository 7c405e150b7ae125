"""``transformer_lm_postln``: fairseq's decoder-only ``transformer_lm`` with Post-LN layers.

fairseq's named ``transformer_lm_*`` architectures (``transformer_lm_big``, ``transformer_lm_gpt``,
...) force ``decoder_normalize_before`` (Pre-LN: "model training is not stable without this");
plain ``--arch transformer_lm`` leaves it to its config default (off in fairseq 0.12). This one is
``transformer_lm`` with the named architectures' defaults and Post-LN whatever the flags say: each
sublayer is followed by its LayerNorm and there is no final LayerNorm, the setting in which GradInit
replaces warmup.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer_lm import base_lm_architecture


@register_model_architecture("transformer_lm", "transformer_lm_postln")
def transformer_lm_postln(args):
    base_lm_architecture(args)
    args.decoder_normalize_before = False
