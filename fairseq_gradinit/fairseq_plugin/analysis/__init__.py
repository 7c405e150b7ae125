"""Analysis of GradInit results in fairseq: the per-layer report (:mod:`.report`), the grouping of
Transformer parameter names (:mod:`.groups`) and the health check of a result (:mod:`.health_report`)."""
