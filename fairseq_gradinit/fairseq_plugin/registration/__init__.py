"""What fairseq sees: the ``translation_gradinit`` task, every other task served with the ``--gradinit-*``
options, the task mixin whose ``build_model``/``build_criterion`` run GradInit, the changes applied to
fairseq when the plugin loads. The top of the adapter: it builds one run and
hands it to :mod:`..phase`."""
