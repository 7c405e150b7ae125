"""The GradInit phase and its files: the frozen run it is given (:mod:`.run`), the phase itself
(:mod:`.compute`), its resumable state, the save-dir lock, the fingerprint stored in ``gradinit.json``, the
signal handling while it runs and what a run says while it trains. The phase never sees the task."""
