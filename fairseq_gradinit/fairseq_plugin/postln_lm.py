"""``transformer_lm_postln``: fairseq's decoder-only ``transformer_lm`` with Post-LN layers.

fairseq's ``transformer_lm`` architectures force ``decoder_normalize_before`` (Pre-LN: "model
training is not stable without this"); this one turns it off, so each sublayer is followed by its
LayerNorm and there is no final LayerNorm, the setting in which GradInit replaces warmup.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer_lm import base_lm_architecture


@register_model_architecture("transformer_lm", "transformer_lm_postln")
def transformer_lm_postln(args):
    base_lm_architecture(args)
    args.decoder_normalize_before = False
