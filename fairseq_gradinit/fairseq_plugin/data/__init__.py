"""fairseq data glue, the bottom of the adapter: reading fairseq's config (:mod:`.cfg`), the model and
batches ``fairseq-train`` builds (:mod:`.training`), the criterion as a mean loss (:mod:`.loss`), the
dictionaries recorded in a checkpoint, and atomic writes into ``--save-dir`` (:mod:`.files`)."""
