"""The optimizers the plugin registers with fairseq: ``--optimizer radam`` (:mod:`.radam`)."""
from .radam import FairseqRAdam  # noqa: F401  (registers --optimizer radam)
