"""Count the operators GradInit's scale bookkeeping dispatches in one objective iteration.

Small models on a GPU are bound by kernel launches, so the number of operators the host issues per
iteration matters beside the FLOPs. This counts, with the PyTorch profiler, the top-level aten
operators of everything an objective iteration does besides its two forward/backward passes:
writing alpha*W, copying g into one buffer, its norm, A[g], writing alpha*W - eta*A[g], and
<dL/dtheta_i, W_i>. Random stand-in gradients replace autograd's (created outside the profiled region). Operator counts do
not depend on the machine's load, unlike times.

    python benchmarks/count_bookkeeping_ops.py --models resnet110:bn,vgg19:bn --out benchmarks/results/bookkeeping_ops
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fairseq_gradinit.core import GradInit, GradInitConfig
from fairseq_gradinit.core.engine import grad_norm, step_direction
from fairseq_gradinit.vision import create_model


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", default="resnet110:bn,resnet110:nobn,vgg19:bn",
                   help="comma-separated registry names, each with :bn or :nobn")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"], help="GradInit's A[g] (sign or g)")
    p.add_argument("--width", type=float, default=0.0625, help="width multiplier (counts do not depend on it)")
    p.add_argument("--out", default="benchmarks/results/bookkeeping_ops", help="output prefix (.json, .md)")
    return p


def top_level_aten_ops(events, *, skip=frozenset()) -> int:
    """aten operators not called from inside another aten operator (and not named in ``skip``)."""
    def nested(e):
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::"):
                return True
            p = p.cpu_parent
        return False
    return sum(1 for e in events if e.name.startswith("aten::") and e.name not in skip and not nested(e))


def count(name: str, bn: bool, args) -> dict:
    torch.manual_seed(0)
    model = create_model(name, bn=bn, width=args.width)
    engine = GradInit(model, lambda m, b: None, GradInitConfig(optimizer=args.optimizer, eta=1e-3, gamma=1.0))
    stand_in = [torch.randn_like(p) for p in engine.target.scaled.params]

    def bookkeeping(grads):
        engine.target.scaled.write(engine.state.alpha)
        grads = engine.target.scaled.gather(grads)  # as GradInit.step: g in one buffer
        gnorm = grad_norm(grads, engine.cfg.norm_p)
        direction = step_direction(grads, gnorm, engine.cfg, engine.state.gamma)
        engine.target.scaled.write(engine.state.alpha, direction=direction, eta=1e-3)
        return engine.target.scaled.alpha_grad(stand_in)

    bookkeeping([g.clone() for g in stand_in])  # warm-up
    grads = [g.clone() for g in stand_in]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        bookkeeping(grads)
    return {"model": name, "bn": bn, "tensors": len(stand_in), "ops": top_level_aten_ops(prof.events()),
            "flat_buffer": getattr(engine.target.scaled, "_flat", None) is not None}


def main(args) -> dict:
    rows = []
    for spec in filter(None, (s.strip() for s in args.models.split(","))):
        name, _, flag = spec.partition(":")
        if flag not in ("bn", "nobn"):
            raise ValueError(f"--models entry {spec!r}: write NAME:bn or NAME:nobn")
        rows.append(count(name, flag == "bn", args))
    report = {"torch": torch.__version__, "optimizer": args.optimizer, "results": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(report, indent=1))
    lines = [f"Top-level aten operators of one objective iteration's scale bookkeeping (torch {torch.__version__}, "
             f"A[g] for {args.optimizer}):", "", "| model | BN | tensors | operators | per tensor |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {'yes' if r['bn'] else 'no'} | {r['tensors']} | {r['ops']} | "
              f"{r['ops'] / r['tensors']:.1f} |" for r in rows]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))  # noqa: T201
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
