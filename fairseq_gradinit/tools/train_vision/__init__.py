"""``gradinit-train-vision``: the GradInit paper's CIFAR recipe with GradInit, MetaInit or the paper's
baselines as initialization. Modules: :mod:`.data` (datasets and augmentation), :mod:`.initialization`
(network, GradInit/MetaInit and their option checks), :mod:`.loop` (schedule, training loop, run folder),
:mod:`.cli` (arguments and the command)."""
