"""The package's commands (``console_scripts`` of setup.py; ``scripts/<name>.py`` call the same ``run``):

- ``gradinit-prepare-corpus`` (:mod:`.prepare_corpus`): a raw parallel corpus to SentencePiece pieces and a
  fairseq data-bin.
- ``gradinit-evaluate-bleu`` (:mod:`.evaluate_bleu`, the command and :mod:`.bleu_checks`): fairseq-generate's
  decode in this process (:mod:`.bleu_decode`, :mod:`.inprocess_generate`) and sacreBLEU's BLEU or chrF
  (:mod:`.bleu_score`) on a checkpoint.
- ``gradinit-report`` (:mod:`.gradinit_report`): the per-layer report of a ``gradinit.json``.
- ``gradinit-valid-loss-modes`` (:mod:`.valid_loss_modes`): a checkpoint's validation loss in eval and
  train mode.
- ``gradinit-plot-curves`` (:mod:`.plot_curves`): training curves of fairseq-train logs.
- ``gradinit-train-vision`` (:mod:`.train_vision`): the paper's CIFAR recipe with GradInit or MetaInit.
- ``gradinit-user-dir`` (:mod:`.user_dir`): the installed package's folder, for ``fairseq-train --user-dir``
  (it imports neither fairseq nor the plugin).
"""
