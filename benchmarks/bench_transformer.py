"""Cost of GradInit iterations vs a training step for a transformer_iwslt_de_en-shaped model.

Measures, in one run and on one device: one training step (forward + backward + Adam) on a batch
of B tokens, one GradInit objective iteration and one constraint iteration drawing the same B
tokens in all (S and S~ each 2/3 of B, sharing 1/3, as the authors' fairseq code splits a batch).
Writes JSON and a Markdown table with the ratios.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` above the memory held before the
measured call; on CPU, each kind runs in a fresh worker process whose first call is made with
glibc's mmap threshold lowered (freed tensors go back to the OS), and the peak resident set
(VmHWM, reset through /proc/self/clear_refs) above the resident set before the call is taken.
Timed calls run afterwards with an ordinary heap.

    python benchmarks/bench_transformer.py --device cpu --max-tokens 2048 --out benchmarks/results
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

KINDS = ("train_step", "gradinit_objective", "gradinit_constraint", "gradinit_constraint_switch",
         "gradinit_constraint_fd")


def get_args_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-tokens", type=int, default=4096, help="B, tokens of a training batch")
    p.add_argument("--seq-len", type=int, default=32, help="source and target length of every sentence")
    p.add_argument("--vocab", type=int, default=10000, help="joint vocabulary size")
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers")
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output directory")
    p.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    return p


def build(args):
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, transformer_iwslt_de_en

    d = Dictionary()
    for i in range(args.vocab - len(d)):
        d.add_symbol(f"w{i}")
    ns = argparse.Namespace(
        encoder_layers=args.layers, decoder_layers=args.layers, encoder_embed_dim=args.embed_dim,
        decoder_embed_dim=args.embed_dim, encoder_ffn_embed_dim=args.ffn_dim,
        decoder_ffn_embed_dim=args.ffn_dim, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, share_all_embeddings=True, dropout=0.3,
        max_source_positions=1024, max_target_positions=1024,
    )
    transformer_iwslt_de_en(ns)
    task = argparse.Namespace(source_dictionary=d, target_dictionary=d)
    model = TransformerModel.build_model(ns, task)
    return model, d


def make_batch(n_sent, args, d, gen, device):
    src = torch.randint(d.nspecial, len(d), (n_sent, args.seq_len), generator=gen)
    tgt = torch.randint(d.nspecial, len(d), (n_sent, args.seq_len), generator=gen)
    prev = torch.cat([torch.full((n_sent, 1), d.eos()), tgt[:, :-1]], dim=1)
    return {
        "net_input": {"src_tokens": src.to(device), "src_lengths": torch.full((n_sent,), args.seq_len, device=device),
                      "prev_output_tokens": prev.to(device)},
        "target": tgt.to(device), "ntokens": n_sent * args.seq_len,
    }


def label_smoothed_loss(model, sample, eps=0.1):
    out = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(out, log_probs=True).view(-1, out[0].size(-1))
    target = sample["target"].view(-1, 1)
    nll = -lprobs.gather(dim=-1, index=target)
    smooth = -lprobs.sum(dim=-1, keepdim=True)
    loss = (1.0 - eps) * nll.sum() + eps / lprobs.size(-1) * smooth.sum()
    return loss / sample["ntokens"]


def _mallopt(param, value):
    """glibc mallopt; returns False where unavailable."""
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):
        return False


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


class Memory:
    def __init__(self, device):
        self.device = torch.device(device)
        if self.device.type == "cpu":
            # While measuring memory, tensors of 64 KiB and more get their own mappings and go back to
            # the OS when freed, so the resident set tracks live memory.
            _mallopt(M_MMAP_THRESHOLD, 65536)
            _mallopt(M_TRIM_THRESHOLD, 0)

    def done(self):
        if self.device.type == "cpu":
            # Timing runs with an ordinary heap: per-allocation mappings would make every op pay
            # for page faults.
            _mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
            _mallopt(M_TRIM_THRESHOLD, 2**30)

    def reset(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = self._status("VmRSS")

    def peak(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return self._status("VmHWM") - self.base

    @staticmethod
    def _status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"{key} not in /proc/self/status")


def worker(args):
    from fairseq_gradinit.core import BatchPair, GradInitConfig
    from fairseq_gradinit.core.engine import GradInit
    from fairseq_gradinit.core.modes import gradinit_mode

    device = torch.device(args.device)
    torch.manual_seed(0)
    model, d = build(args)
    model.to(device)
    gen = torch.Generator().manual_seed(0)
    n = max(3, args.max_tokens // args.seq_len)
    third = n // 3
    full = make_batch(n, args, d, gen, device)
    pair_src = make_batch(3 * third, args, d, gen, device)

    def sub(batch, idx):
        return {"net_input": {k: v[idx] for k, v in batch["net_input"].items()}, "target": batch["target"][idx],
                "ntokens": len(idx) * args.seq_len}

    idx = torch.arange(3 * third, device=device)
    pair = BatchPair(sub(pair_src, idx[:2 * third]), sub(pair_src, idx[third:]))
    mem = Memory(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    if args.worker == "train_step":
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

        def op():
            opt.zero_grad(set_to_none=True)
            label_smoothed_loss(model, full).backward()
            opt.step()
        ctx = None
    else:
        gamma = 1e30 if args.worker == "gradinit_objective" else 1e-30
        # Without graph reuse every constraint iteration is priced like one after an objective iteration.
        cfg = GradInitConfig(optimizer="adam", eta=1e-3, gamma=gamma, lr=2.5e-3, iters=None,
                             reuse_graph=args.worker != "gradinit_constraint_switch",
                             constraint_grad="finite_difference" if args.worker.endswith("_fd") else "exact")
        ctx = gradinit_mode(model)
        ctx.__enter__()
        engine = GradInit(model, label_smoothed_loss, cfg)

        def op():
            engine.step(pair)

    # The first call is measured for memory (it includes the allocations a real run has once:
    # Adam state, W copies); later calls are timed.
    mem.reset()
    op()
    sync()
    peak = mem.peak()
    mem.done()
    op()  # warm the ordinary heap
    sync()
    times = []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - t0)
    if ctx is not None:
        if args.worker != "train_step":
            branch = engine.history[-1].branch
            expected = "objective" if args.worker == "gradinit_objective" else "constraint"
            assert branch == expected, (branch, expected)
        ctx.__exit__(None, None, None)
    return {"kind": args.worker, "median_s": statistics.median(times), "times_s": times, "peak_bytes": peak,
            "sentences": n, "tokens": n * args.seq_len,
            "pair_tokens": {"s": 2 * third * args.seq_len, "s_tilde": 2 * third * args.seq_len,
                            "shared": third * args.seq_len}}


def main(args):
    if args.worker:
        print(json.dumps(worker(args)))  # noqa: T201 - worker protocol
        return None
    env = dict(os.environ)
    env["PYTHONWARNINGS"] = "ignore"
    results = {}
    for kind in KINDS:
        cmd = [sys.executable, __file__, "--worker", kind] + [
            a for a in sys.argv[1:] if not a.startswith("--worker")]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"worker {kind} failed:\n{proc.stderr[-3000:]}")
        results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{kind}: {results[kind]['median_s']:.3f} s, peak {results[kind]['peak_bytes'] / 2**20:.0f} MiB",
              flush=True)  # noqa: T201
    t = results["train_step"]
    o = results["gradinit_objective"]
    c = results["gradinit_constraint"]
    w = results["gradinit_constraint_switch"]
    f = results["gradinit_constraint_fd"]
    ratios = {
        "objective_time": o["median_s"] / t["median_s"],
        "constraint_time": c["median_s"] / t["median_s"],
        "objective_peak_memory": o["peak_bytes"] / t["peak_bytes"],
        "constraint_peak_memory": c["peak_bytes"] / t["peak_bytes"],
        "constraint_switch_time": w["median_s"] / t["median_s"],
        "constraint_switch_peak_memory": w["peak_bytes"] / t["peak_bytes"],
        "constraint_fd_time": f["median_s"] / t["median_s"],
        "constraint_fd_peak_memory": f["peak_bytes"] / t["peak_bytes"],
    }
    # The paper's recipe: 780 GradInit iterations before 100k training updates.
    share_obj = 780 * o["median_s"] / (100_000 * t["median_s"] + 780 * o["median_s"])
    share_con = 780 * c["median_s"] / (100_000 * t["median_s"] + 780 * c["median_s"])
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
        f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    report = {
        "device": device_name, "torch": torch.__version__, "settings": {
            k: getattr(args, k) for k in ("max_tokens", "seq_len", "vocab", "layers", "embed_dim", "ffn_dim",
                                          "heads", "repeats")},
        "results": results, "ratios": ratios,
        "targets": {"objective_time": 1.6, "constraint_time": 3.0, "objective_peak_memory": 1.3,
                    "recipe_share": 0.015},
        "recipe_share": {"all_objective": share_obj, "all_constraint": share_con},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"transformer_{args.device.split(':')[0]}_B{args.max_tokens}"
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1))
    lines = [
        f"### {tag}: {device_name}, torch {torch.__version__}, B={args.max_tokens} tokens, "
        f"{args.layers}+{args.layers} layers, d={args.embed_dim}, ffn={args.ffn_dim}",
        "",
        "| measurement | median time (s) | time / train step | peak memory (MiB) | memory / train step | target |",
        "|---|---|---|---|---|---|",
        f"| training step (fwd+bwd+Adam, B tokens) | {t['median_s']:.3f} | 1.00 | {t['peak_bytes'] / 2**20:.0f} | 1.00 | |",
        f"| GradInit objective iteration | {o['median_s']:.3f} | {ratios['objective_time']:.2f} | "
        f"{o['peak_bytes'] / 2**20:.0f} | {ratios['objective_peak_memory']:.2f} | time <= 1.6, memory <= 1.3 |",
        f"| GradInit constraint iteration | {c['median_s']:.3f} | {ratios['constraint_time']:.2f} | "
        f"{c['peak_bytes'] / 2**20:.0f} | {ratios['constraint_peak_memory']:.2f} | time <= 3 |",
        f"| GradInit constraint iteration after an objective one (two passes over S) | {w['median_s']:.3f} | "
        f"{ratios['constraint_switch_time']:.2f} | {w['peak_bytes'] / 2**20:.0f} | "
        f"{ratios['constraint_switch_peak_memory']:.2f} | time <= 3 |",
        f"| GradInit constraint iteration, constraint_grad=finite_difference (opt-in) | {f['median_s']:.3f} | "
        f"{ratios['constraint_fd_time']:.2f} | {f['peak_bytes'] / 2**20:.0f} | "
        f"{ratios['constraint_fd_peak_memory']:.2f} | |",
        "",
        "A constraint iteration that follows a constraint iteration keeps the second-order graph of its first "
        "pass over S (one pass); one that follows an objective iteration needs a second pass.",
        "",
        f"Projected share of the paper's recipe (780 GradInit iterations + 100k updates): "
        f"{100 * share_obj:.2f}% if all iterations are objective ones, {100 * share_con:.2f}% if all are "
        "constraint ones (target <= 1.5%).",
        "",
    ]
    (out / f"{tag}.md").write_text("\n".join(lines))
    print("\n".join(lines))  # noqa: T201
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
