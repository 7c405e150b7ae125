"""What the cuDNN attention guard costs: fp16 training steps with cuDNN attention on and off.

A ``transformer_iwslt_de_en``-shaped model (``bench_transformer.build``) in fp16 takes forward +
backward + SGD steps on batches of B tokens whose sentence length changes from step to step (every
length in ``--lengths``, each with B // length sentences), twice: the first pass meets every shape for
the first time (cuDNN attention builds an execution plan per new shape), the second pass meets them
again. Each setting (cuDNN attention on, off) runs in a fresh worker process, so that neither finds
the other's plans. Also counted: steps whose gradients are not all finite. Writes JSON and Markdown.

    python benchmarks/bench_sdpa_guard.py --device cuda --out benchmarks/results
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench_transformer import build, label_smoothed_loss  # this folder is sys.path[0] when the benchmark runs

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ("cudnn_on", "cudnn_off")


def get_args_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-tokens", type=int, default=4096, help="B, tokens of a training batch")
    p.add_argument("--lengths", default="21,30,45,54,64,68,77,90,101,118",
                   help="comma-separated sentence lengths, one batch shape each (64 included: the faulty residue)")
    p.add_argument("--vocab", type=int, default=6000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--tag", default=None, help="output name (default: sdpa_guard_<device>)")
    p.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    return p


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(args) -> dict:
    """One setting in this process: per pass, the time of each step (ms) and the non-finite steps."""
    device = torch.device(args.device)
    torch.backends.cuda.enable_cudnn_sdp(args.worker == "cudnn_on")
    torch.manual_seed(0)
    model, d = build(argparse.Namespace(**{**vars(args), "seq_len": 0}))
    model.to(device)
    if device.type == "cuda":
        model.half()
    gen = torch.Generator().manual_seed(0)
    lengths = [int(x) for x in args.lengths.split(",")]
    out = {"setting": args.worker, "passes": []}
    for _ in range(2):
        times, nonfinite = [], 0
        for length in lengths:
            n = max(args.max_tokens // length, 1)
            src = torch.randint(d.nspecial, len(d), (n, length), generator=gen)
            prev = torch.cat([torch.full((n, 1), d.eos()), src[:, :-1]], dim=1)
            sample = {"net_input": {"src_tokens": src.to(device), "src_lengths": torch.full((n,), length, device=device),
                                    "prev_output_tokens": prev.to(device)}, "target": src.to(device), "ntokens": n * length}
            model.zero_grad(set_to_none=True)
            sync(device)
            start = time.perf_counter()
            (label_smoothed_loss(model, sample) * 128.0).backward()
            with torch.no_grad():
                finite = torch.stack([torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None])
                for p in model.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-1e-6)
            sync(device)
            times.append((time.perf_counter() - start) * 1e3)
            nonfinite += int((~finite).any())
        out["passes"].append({"ms": times, "median_ms": statistics.median(times), "nonfinite_steps": nonfinite})
    return out


def main(args) -> dict:
    results = {}
    for setting in SETTINGS:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", setting]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[setting] = json.loads(proc.stdout.strip().splitlines()[-1])
    on, off = results["cudnn_on"]["passes"], results["cudnn_off"]["passes"]
    report = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "args": vars(args),
        "results": results,
        "ratio_off_over_on_first_pass": off[0]["median_ms"] / on[0]["median_ms"],
        "ratio_off_over_on_second_pass": off[1]["median_ms"] / on[1]["median_ms"],
    }
    tag = args.tag or f"sdpa_guard_{args.device.split(':')[0]}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = ["| setting | first pass: median ms/step | second pass | steps with non-finite gradients |", "|---|---:|---:|---:|"]
    rows += [f"| {s} | {r['passes'][0]['median_ms']:.1f} | {r['passes'][1]['median_ms']:.1f} | "
             f"{r['passes'][0]['nonfinite_steps'] + r['passes'][1]['nonfinite_steps']} |" for s, r in results.items()]
    (out / f"{tag}.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return report


if __name__ == "__main__":
    a = get_args_parser().parse_args()
    if a.worker:
        print(json.dumps(worker(a)))
    else:
        main(a)
