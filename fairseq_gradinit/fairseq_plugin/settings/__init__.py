"""The ``--gradinit-*`` options and every check of them: their declaration, the run's plan resolved once
from fairseq's config (:mod:`.plan`), the one registry of checks (:mod:`.validation`), a saved
``gradinit.json`` given as an init file, and which checkpoint a run will restore."""
