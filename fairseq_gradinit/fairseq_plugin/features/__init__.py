"""Side features of a fairseq run, each behind its own option: per-use scales of tied embeddings
(:mod:`.tied`), the training monitor (:mod:`.monitor`, :mod:`.monitor_stats`), the cuDNN attention guard
(:mod:`.sdpa`), the health check (:mod:`.health`) and the Transformer parameter groups they
name (:mod:`.groups`)."""
