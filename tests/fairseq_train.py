"""fairseq-train in this process or as a command, on the tiny models the plugin tests share."""
import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq import options, tasks, utils  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from fairseq.distributed import utils as distributed_utils  # noqa: E402

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (registers the tasks, models and optimizers)

from fairseq_helpers import REPO  # noqa: E402

BIN = Path(sys.executable).parent

#: fairseq's training iterator collates batches ahead in a daemon thread (--data-buffer-size); a run of one or two
#: updates can end while that thread is still inside torch, and a daemon thread in C++ code at interpreter exit
#: aborts the process ("terminate called without an active exception"). The tests' short runs turn it off.
NO_BATCH_THREAD = ("--data-buffer-size", "0")

TINY_MODEL = [
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--dropout", "0.1",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--max-tokens", "400",
    "--cpu", "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1",
    "--num-workers", "0", "--seed", "3", "--no-progress-bar", *NO_BATCH_THREAD,
]


def train_inprocess(argv, tpu=None):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    if tpu is not None:
        cfg.common.tpu = tpu
    from fairseq_cli import train
    from fairseq_gradinit.fairseq_plugin.phase.lock import release_save_dirs

    try:
        distributed_utils.call_main(cfg, train.main)
    finally:  # what the end of a fairseq-train process does: its --save-dir is free again
        release_save_dirs()
    return cfg


def fresh_model(argv):
    """The model fairseq-train builds for ``argv`` before any training (same RNG sequence)."""
    import numpy as np

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model, from_checkpoint=True)


def checkpoint_state(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    return state["model"]


def assert_same_weights(model, state, exact=True):
    own = model.state_dict()
    for k, v in state.items():
        if k not in own or not torch.is_floating_point(v):
            continue
        if exact:
            assert torch.equal(own[k].to(v.dtype), v), k
        else:
            torch.testing.assert_close(own[k].to(v.dtype), v, rtol=0, atol=1e-3, msg=k)


def env_with_repo():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


TINY_LM = [
    "--task", "language_modeling", "--decoder-layers", "2", "--decoder-embed-dim", "32",
    "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--tokens-per-sample", "32",
    "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256",
    "--cpu", "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1", "--num-workers", "0",
    "--seed", "3", "--no-progress-bar",
]

TINY_ONE_LAYER = [
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
    "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--optimizer", "adam", "--max-tokens", "300", "--cpu", "--seed", "3", "--num-workers", "0",
]

TINY_TIED_MODEL = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
                   "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                   "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
                   "--dropout", "0.0", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                   "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--seed", "3", "--cpu",
                   "--num-workers", "0", "--log-format", "simple", "--no-progress-bar", *NO_BATCH_THREAD]


def parse(argv):
    """fairseq-train's parsed command line for ``argv``."""
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


def train(argv):
    """fairseq-train's main on ``argv`` in this process."""
    from fairseq_cli import train as fairseq_train

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), fairseq_train.main)


def readme_train_commands(text):
    """The ``fairseq-train`` commands of a Markdown text's bash blocks, split as a shell would."""
    import re
    import shlex

    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        cmds += [shlex.split(line, comments=True) for line in joined.splitlines()
                 if line.startswith("fairseq-train ")]
    return cmds
