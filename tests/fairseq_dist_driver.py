"""Runs fairseq-train in one rank and dumps what the distributed test compares.

Usage: python fairseq_dist_driver.py OUT.pt <fairseq-train arguments>
"""
import sys

import torch


def main():
    out, argv = sys.argv[1], sys.argv[2:]
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)  # imports the plugin (--user-dir)
    from fairseq_gradinit.fairseq_plugin.registration.hook import GradInitTaskMixin

    record = {}
    original_run = GradInitTaskMixin.run

    def run(self, plan, model, criterion):
        losses = []

        def counting(model_, sample, *a, **k):
            loss, ss, log = criterion.__class__.forward(criterion, model_, sample, *a, **k)
            losses.append(float(loss.detach()) / max(float(ss), 1.0))
            return loss, ss, log

        criterion.forward = counting
        try:
            result = original_run(self, plan, model, criterion)
        finally:
            del criterion.forward
        record["scales"] = result.scales
        record["world_size"] = result.world_size
        record["local_losses"] = losses
        record["after_gradinit"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return result

    GradInitTaskMixin.run = run
    # Weights after the last update, on every rank (only rank 0 saves checkpoints).
    original_train = train.train

    def train_and_capture(cfg, trainer, task, epoch_itr):
        res = original_train(cfg, trainer, task, epoch_itr)
        sd = trainer.get_model().state_dict()
        record["after_training"] = {k: v.detach().clone() for k, v in sd.items()}
        return res

    train.train = train_and_capture
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, train.main)
    torch.save(record, out)


if __name__ == "__main__":
    main()
