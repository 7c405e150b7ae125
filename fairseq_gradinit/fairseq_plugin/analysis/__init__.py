"""The per-layer report of a GradInit result in fairseq (:mod:`.per_layer`, the ``gradinit-report`` command's
engine): the top of the plugin, using the adapter's public pieces; nothing in the plugin imports it."""
