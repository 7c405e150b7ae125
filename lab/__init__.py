"""The research lab of fairseq_gradinit: the study runner (named fairseq-train arms within a wall-time budget,
presets, GPU-time estimates) and the tables of finished studies. It depends on the installed library
(``fairseq_gradinit``), never the reverse; run it from the root of a checkout (``python -m lab.study``)."""
