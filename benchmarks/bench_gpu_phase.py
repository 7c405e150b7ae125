"""Seconds per GradInit iteration of the d=512 transformer_iwslt_de_en in each precision, against
one fp16 training update of the same tokens, and the projected 780-iteration phase.

For each precision (fp32, tf32, bf16) and each branch (objective: gamma huge; constraint: gamma
tiny), starting from the same initial weights and on the same batches: ``--warmup`` iterations,
then ``--iters`` timed ones. Reported: seconds per iteration, the ratio to one fp16 training update
(forward + backward + Adam on S, timed in the same process: ``model.half()``, loss scaling, fp32
master weights in one flat buffer, as fairseq's ``--fp16``; timed on batches whose shapes it has
seen before, as in a training run, where every batch shape recurs each epoch), peak memory, the
projected phase (780 iterations, ``OBJECTIVE_SHARE`` of them objective as in the recorded run), the
largest relative difference of the learned scales from fp32 after the same iterations, the host
reads and syncs of one iteration, the profile of ``--profile-iters`` more (aten operators; on
CUDA also GPU-busy time and kernel launches), and the floor: the FLOPs of each kind of pass,
counted by ``torch.utils.flop_counter`` on the real model, against the GPU's dense peak for the
dtype. ``--cudnn-sdpa`` sets the attention backend of the training update as in training
(GradInit's own passes never use cuDNN attention). Writes ``<out>/<tag>.json`` and ``<out>/<tag>.md``.

    python benchmarks/bench_gpu_phase.py --device cuda                       # synthetic tokens
    python benchmarks/bench_gpu_phase.py --device cuda --data-bin data-bin/iwslt14/bin
    python benchmarks/bench_gpu_phase.py --tiny --device cpu --out /tmp/x    # seconds, for tests
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import time
from pathlib import Path

import torch

from bench_transformer import label_smoothed_loss  # this folder is sys.path[0] when the benchmark runs
from count_bookkeeping_ops import top_level_aten_ops
from host_syncs import HostSyncCounter

REPO = Path(__file__).resolve().parents[1]

PRECISIONS = ("fp32", "tf32", "bf16")
BRANCHES = ("objective", "constraint")
#: The projected phase: the README IWSLT recipe's 780 iterations, with the objective share of its recorded
#: phase (benchmarks/README.md).
OBJECTIVE_SHARE = 0.3
PHASE_ITERS = 780
#: Dense peak TFLOPS by dtype (NVIDIA datasheets; the "with sparsity" figures halved).
PEAK_TFLOPS = {
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
}
TINY = dict(layers=1, embed_dim=16, ffn_dim=32, heads=2, vocab_src=60, vocab_tgt=50, max_tokens=96, seq_len=8,
            iters=3, warmup=1)
#: Host-side calls that launch work on a CUDA device (runtime and driver API), as the profiler names them.
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def get_args_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--data-bin", help="a fairseq translation data-bin (e.g. data-bin/iwslt14/bin); default: "
                                      "synthetic tokens")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated subset of fp32,tf32,bf16 "
                                                                      "(fp32 always runs: the reference)")
    p.add_argument("--iters", type=int, default=40, help="timed iterations per branch and precision")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations before them")
    p.add_argument("--profile-iters", type=int, default=2, help="iterations profiled after the timed ones")
    p.add_argument("--cudnn-sdpa", choices=["on", "off"], default="on",
                   help="cuDNN attention for the fp16 training update (torch.backends.cuda.enable_cudnn_sdp): as "
                        "the training run it stands for has it")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens of S, of a training batch (--max-tokens "
                                                                "of the recipe); a draw is (2 - overlap) x this")
    p.add_argument("--overlap", type=float, default=0.5)
    p.add_argument("--seq-len", type=int, default=24, help="synthetic: source and target length of a sentence")
    p.add_argument("--len-jitter", type=int, default=4, help="synthetic: draw i has sentences of --seq-len + "
                                                                  "(i mod (2j+1)) - j tokens")
    p.add_argument("--vocab-src", type=int, default=5008, help="synthetic: source dictionary size")
    p.add_argument("--vocab-tgt", type=int, default=3728, help="synthetic: target dictionary size")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--peak-tflops", help="dense peaks for an unlisted GPU, e.g. 'fp32=67,tf32=495,bf16=989,fp16=989'")
    p.add_argument("--tiny", action="store_true", help="a 1+1-layer d=16 model and 3 iterations (a test of the "
                                                       "script, seconds on a CPU)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output directory")
    p.add_argument("--tag", help="output file name (default gpu_phase_<device>[_tiny])")
    return p


# -- the model and its batches ------------------------------------------------------------------
def build_synthetic(args, device):
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, transformer_iwslt_de_en

    from fairseq_gradinit.core import BatchPair

    dicts = []
    for n in (args.vocab_src, args.vocab_tgt):
        d = Dictionary()
        for i in range(n - len(d)):
            d.add_symbol(f"w{i}")
        dicts.append(d)
    ns = argparse.Namespace(
        encoder_layers=args.layers, decoder_layers=args.layers, encoder_embed_dim=args.embed_dim,
        decoder_embed_dim=args.embed_dim, encoder_ffn_embed_dim=args.ffn_dim, decoder_ffn_embed_dim=args.ffn_dim,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        share_decoder_input_output_embed=True, dropout=0.3, max_source_positions=1024, max_target_positions=1024)
    transformer_iwslt_de_en(ns)
    torch.manual_seed(args.seed)
    model = TransformerModel.build_model(ns, argparse.Namespace(source_dictionary=dicts[0],
                                                                target_dictionary=dicts[1])).to(device)
    gen = torch.Generator().manual_seed(args.seed)

    def batch(n, length):
        src = torch.randint(dicts[0].nspecial, len(dicts[0]), (n, length), generator=gen)
        tgt = torch.randint(dicts[1].nspecial, len(dicts[1]), (n, length), generator=gen)
        tgt[:, -1] = dicts[1].eos()
        prev = torch.cat([torch.full((n, 1), dicts[1].eos()), tgt[:, :-1]], dim=1)
        return {"net_input": {"src_tokens": src, "src_lengths": torch.full((n,), length),
                              "prev_output_tokens": prev}, "target": tgt, "ntokens": n * length}

    def sub(b, lo, hi):
        return {"net_input": {k2: v[lo:hi] for k2, v in b["net_input"].items()}, "target": b["target"][lo:hi],
                "ntokens": int(b["target"][lo:hi].numel())}

    def pair(i):
        # Batches of length-bucketed sentences: one length per draw, cycling through 2 * len_jitter + 1
        # lengths around --seq-len (shapes differ from draw to draw, as the plugin's batches do).
        length = max(2, args.seq_len + i % (2 * args.len_jitter + 1) - args.len_jitter)
        n = max(2, args.max_tokens // length)
        k = int(round(args.overlap * n))
        b = batch(2 * n - k, length)  # S and S~ share k sentences, as the plugin splits a draw
        return BatchPair(sub(b, 0, n), sub(b, n - k, 2 * n - k))

    from fairseq_gradinit.core.prefetch import move_to_device

    count = args.warmup + args.iters + 1 + args.profile_iters
    # Moved to the device once, before anything is timed.
    pairs = [move_to_device(pair(i), device) for i in range(count)]

    def pair_stream():
        return iter(pairs), (lambda: None)

    return model, label_smoothed_loss, pair_stream, {
        "source": "synthetic", "seq_len": args.seq_len, "len_jitter": args.len_jitter,
        "vocab": [args.vocab_src, args.vocab_tgt]}


def build_data_bin(args, device):
    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (registers the plugin's tasks)
    from fairseq_gradinit.fairseq_plugin.data.loss import mean_loss_fn
    from fairseq_gradinit.fairseq_plugin.data.training import build_training_model

    argv = [args.data_bin, "--user-dir", str(REPO / "fairseq_gradinit"), "--task", "translation",
            "--arch", "transformer_iwslt_de_en", "--share-decoder-input-output-embed", "--dropout", "0.3",
            "--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers),
            "--encoder-embed-dim", str(args.embed_dim), "--decoder-embed-dim", str(args.embed_dim),
            "--encoder-ffn-embed-dim", str(args.ffn_dim), "--decoder-ffn-embed-dim", str(args.ffn_dim),
            "--encoder-attention-heads", str(args.heads), "--decoder-attention-heads", str(args.heads),
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
            "--lr", "5e-4", "--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    if device.type == "cpu":
        argv.append("--cpu")
    fm = build_training_model(argv, device=str(device))
    draw = int(round((2 - args.overlap) * args.max_tokens))

    def pair_stream():
        # The plugin's own batches: the same sequence every time (its generator is seeded).
        pairs = fm.task.gradinit_pairs(fm.model, draw, args.overlap, device)
        return pairs, pairs.close

    return fm.model, mean_loss_fn(fm.criterion), pair_stream, {
        "source": os.path.abspath(args.data_bin), "tokens_per_draw": draw}


# -- measurements -------------------------------------------------------------------------------
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_mib(device, base):
    if device.type != "cuda":
        return None
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def engine_config(branch: str, precision: str):
    from fairseq_gradinit.core import GradInitConfig

    # The plugin's defaults for the recipe; gamma forces the branch.
    return GradInitConfig(optimizer="adam", eta=1e-3, gamma=1e30 if branch == "objective" else 1e-30, lr=2.5e-3,
                          betas=(0.9, 0.98), adam_state="per_branch", iters=None, log_interval=10**9,
                          scale_bounds=(("bias", 0, None), ("norm", None, 100)), precision=precision)


def count_flops(model, state, loss_fn, pair):
    """Counted FLOPs: forward on S, forward+backward on S, an objective iteration, a constraint
    iteration that reuses the graph of the one before (fp32)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fairseq_gradinit.core import GradInit, gradinit_mode

    def counted(fn):
        with FlopCounterMode(display=False) as fc:
            fn()
        return int(fc.get_total_flops())

    out = {}
    params = [p for p in model.parameters() if p.requires_grad]
    with gradinit_mode(model):
        out["forward_S"] = counted(lambda: loss_fn(model, pair.s))
        out["train_update_S"] = counted(lambda: torch.autograd.grad(loss_fn(model, pair.s), params))
        for branch in BRANCHES:
            model.load_state_dict(state)
            engine = GradInit(model, loss_fn, engine_config(branch, "fp32"))
            if branch == "constraint":
                engine.step(pair)  # the next one keeps this graph, as in a run of constraint iterations
            out[branch] = counted(lambda: engine.step(pair))
            engine = None  # frees its tensors before the next branch (the lambda above reads the name)
    model.load_state_dict(state)
    return out


def time_fp16_updates(model, state, loss_fn, pairs, args, device):
    """Seconds per fp16 training update on S, as fairseq --fp16 makes it."""
    half = copy.deepcopy(model)
    half.load_state_dict(state)
    half.half().train()
    params = [p for p in half.parameters() if p.requires_grad]
    sizes = [p.numel() for p in params]
    master = torch.cat([p.detach().float().reshape(-1) for p in params]).requires_grad_()
    master.grad = torch.zeros_like(master)
    grad_views, master_views = list(master.grad.split(sizes)), list(master.detach().split(sizes))
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.Adam([master], lr=5e-4, betas=(0.9, 0.98), **fused)
    scale = 128.0

    def update(sample):
        for p in params:
            p.grad = None
        (loss_fn(half, sample) * scale).backward()
        torch._foreach_copy_(grad_views, [torch.zeros_like(p).reshape(-1) if p.grad is None else p.grad.reshape(-1)
                                          for p in params])
        master.grad.mul_(1.0 / scale)
        if not torch.isfinite(master.grad.norm()):  # fairseq's overflow check reads the norm (a host sync)
            return
        opt.step()
        torch._foreach_copy_([p.detach().view(-1) for p in params], master_views)

    samples = [p.s for p in pairs][args.warmup:args.warmup + args.iters]
    # Training sees every batch shape again each epoch, so cuDNN's per-shape plans are built once and
    # reused; one untimed pass over the timed batches puts the timed pass in that state.
    for s in samples:
        update(s)
    base = reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    for s in samples:
        update(s)
    sync(device)
    seconds = (time.perf_counter() - t0) / args.iters
    out = {"seconds": seconds, "peak_mib": peak_mib(device, base),
           "profile": profile_iterations(update, samples[:args.profile_iters], device)}
    return out


#: aten operators that make a view or an allocation: they launch no kernel on any device.
NO_KERNEL_OPS = {"aten::" + n for n in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "slice", "select", "narrow", "t", "transpose",
    "permute", "expand", "squeeze", "unsqueeze", "detach", "alias", "split", "split_with_sizes", "unbind", "chunk",
    "unflatten", "flatten", "view_as", "expand_as", "empty", "empty_like", "empty_strided", "resize_", "lift_fresh",
    "contiguous", "numpy_T", "_local_scalar_dense", "item", "is_nonzero", "result_type", "to", "_to_copy_noop")}


def compute_ops(events) -> int:
    """Top-level aten operators that are not views or allocations: a CPU stand-in for the kernel
    launches of a GPU (a ``_foreach_*`` operator counts once, as its multi-tensor kernels launch a few)."""
    return top_level_aten_ops(events, skip=NO_KERNEL_OPS)


def profile_iterations(step, items, device):
    """Per call of ``step`` on each of ``items``, under torch.profiler: top-level aten operators and
    the counts of aten::mul and aten::dot; on CUDA also the GPU-busy milliseconds (kernels, copies
    and memsets summed), the kernel launches and the stream synchronizations."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if not items:
        return None
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:
        for item in items:
            step(item)
        sync(device)
    events, n = prof.events(), len(items)
    names = [e.name for e in events]
    out = {"aten_ops": top_level_aten_ops(events) / n, "aten_kernels": compute_ops(events) / n,
           "aten_mul": names.count("aten::mul") / n,
           "aten_dot": names.count("aten::dot") / n, "gpu_busy_ms": None, "launches": None, "stream_syncs": None}
    if cuda:
        busy_us = sum(e.time_range.elapsed_us() for e in events if e.device_type == DeviceType.CUDA)
        out.update(gpu_busy_ms=busy_us / 1e3 / n, launches=sum(names.count(a) for a in LAUNCH_APIS) / n,
                   stream_syncs=(names.count("cudaStreamSynchronize") + names.count("cudaDeviceSynchronize")) / n)
    return out


def run_branch(model, state, loss_fn, pair_stream, branch, precision, args, device):
    from fairseq_gradinit.core import GradInit, gradinit_mode

    model.load_state_dict(state)
    base = reset_peak(device)
    engine = GradInit(model, loss_fn, engine_config(branch, precision))
    pairs, close = pair_stream()
    try:
        with gradinit_mode(model):
            for _ in range(args.warmup):
                engine.step(next(pairs))
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                engine.step(next(pairs))
            sync(device)
            seconds = (time.perf_counter() - t0) / args.iters
            engine.finalize()
            scales = engine.target.scaled.scales_dict()
            # One more iteration, counted, then a few profiled (the scales above are already taken).
            pair = next(pairs)
            with HostSyncCounter(device) as counter:
                engine.step(pair)
            syncs = counter.counts.pop("cuda_sync", 0) if device.type == "cuda" else None
            profiled = profile_iterations(engine.step, [next(pairs) for _ in range(args.profile_iters)], device)
            engine.finalize()
    finally:
        close()
    branches = {r.branch for r in engine.history}
    if branches != {branch}:
        raise RuntimeError(f"{precision} {branch} run took the branches {sorted(branches)}")
    return {"seconds": seconds, "peak_mib": peak_mib(device, base), "scales": scales, "host_syncs": syncs,
            "host_reads": counter.total, "profile": profiled, "last_loss_s": engine.history[-1].loss_s,
            "tensors": len(engine.target.scaled.params)}


def gpu_peaks(device, override):
    if override:
        try:
            peaks = {k.strip(): float(v) for k, v in (kv.split("=") for kv in override.split(","))}
        except ValueError:
            peaks = {}
        missing = [k for k in ("fp32", "tf32", "bf16", "fp16") if not peaks.get(k, 0) > 0]
        if missing:
            get_args_parser().error(f"--peak-tflops {override!r}: give a number > 0 for each of fp32, tf32, bf16 "
                                    "and fp16, e.g. 'fp32=67,tf32=494.7,bf16=989.4,fp16=989.4'")
        return peaks, "--peak-tflops"
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    if "H200" in name:
        return PEAK_TFLOPS["H200"], "H200"
    if "H100" in name:
        key = "H100 PCIe" if "PCIe" in name else "H100 NVL" if "NVL" in name else "H100 SXM"
        return PEAK_TFLOPS[key], key
    if "A100" in name:
        return PEAK_TFLOPS["A100"], "A100"
    return None, None


def max_rel_diff(a, b):
    return max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) for k in b)


def phase_row(results, precision, train, flops, peaks):
    """The table row of one precision: times, ratios, memory, the projected phase against its floor,
    the scales' difference from fp32, host reads/syncs and the profile of each branch."""
    o, c = results[precision]["objective"], results[precision]["constraint"]
    phase = PHASE_ITERS * (OBJECTIVE_SHARE * o["seconds"] + (1 - OBJECTIVE_SHARE) * c["seconds"])
    row = {
        "objective_s": o["seconds"], "constraint_s": c["seconds"],
        "objective_per_fp16_update": o["seconds"] / train["seconds"],
        "constraint_per_fp16_update": c["seconds"] / train["seconds"],
        "objective_peak_mib": o["peak_mib"], "constraint_peak_mib": c["peak_mib"],
        "projected_phase_s": phase,
        "max_rel_scale_diff_vs_fp32": {b: max_rel_diff(results[precision][b]["scales"],
                                                       results["fp32"][b]["scales"]) for b in BRANCHES},
        "host_syncs_per_iteration": {b: results[precision][b]["host_syncs"] for b in BRANCHES},
        "host_reads_per_iteration": {b: results[precision][b]["host_reads"] for b in BRANCHES},
        "profile_per_iteration": {b: results[precision][b]["profile"] for b in BRANCHES},
    }
    if peaks:
        peak = peaks[precision] * 1e12
        row["floor_s"] = {b: flops[b] / peak for b in BRANCHES}
        row["projected_phase_floor_s"] = PHASE_ITERS * (OBJECTIVE_SHARE * row["floor_s"]["objective"]
                                                        + (1 - OBJECTIVE_SHARE) * row["floor_s"]["constraint"])
        row["phase_over_floor"] = phase / row["projected_phase_floor_s"]
    return row


def main(args):
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    precisions = ["fp32"] + [p for p in (s.strip() for s in args.precisions.split(",")) if p and p != "fp32"]
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        get_args_parser().error(f"--precisions {','.join(bad)}: expected a subset of {','.join(PRECISIONS)}")
    device = torch.device(args.device)
    peaks, peak_source = gpu_peaks(device, args.peak_tflops)
    if args.profile_iters < 1 or args.profile_iters > args.iters:
        get_args_parser().error(f"--profile-iters {args.profile_iters}: give 1 to --iters ({args.iters})")
    with cudnn_attention(args.cudnn_sdpa == "on"):
        return measure(args, device, precisions, peaks, peak_source)


@contextlib.contextmanager
def cudnn_attention(enabled: bool):
    """cuDNN attention on or off inside (torch.backends.cuda.enable_cudnn_sdp), restored on exit."""
    if not hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        yield
        return
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def measure(args, device, precisions, peaks, peak_source):
    start = time.perf_counter()
    build = build_data_bin if args.data_bin else build_synthetic
    model, loss_fn, pair_stream, data = build(args, device)
    model.to(device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pairs, close = pair_stream()
    try:
        first = [next(pairs) for _ in range(args.warmup + args.iters)]
    finally:
        close()
    tokens_s = sum(int(p.s["ntokens"]) for p in first) / len(first)
    flops = count_flops(model, state, loss_fn, first[0])
    train = time_fp16_updates(model, state, loss_fn, first, args, device)
    notes = []
    if device.type != "cuda":
        notes.append("tf32 changes only CUDA matmuls and convolutions: on a CPU it runs as fp32")
        notes.append("bf16 runs under CPU autocast; times on a CPU say nothing about a GPU")
    results = {}
    for precision in precisions:
        for branch in BRANCHES:
            r = run_branch(model, state, loss_fn, pair_stream, branch, precision, args, device)
            results.setdefault(precision, {})[branch] = r
            print(f"{precision:5s} {branch:10s} {r['seconds'] * 1e3:9.2f} ms/iteration", flush=True)  # noqa: T201
    model.load_state_dict(state)

    rows = {p: phase_row(results, p, train, flops, peaks) for p in precisions}
    fp32_moves = {b: max(abs(v - 1.0) for v in results["fp32"][b]["scales"].values()) for b in BRANCHES}
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    report = {
        "device": device_name, "torch": torch.__version__, "tiny": bool(args.tiny),
        "settings": {k: getattr(args, k) for k in ("iters", "warmup", "profile_iters", "cudnn_sdpa", "max_tokens",
                                                   "overlap", "layers", "embed_dim", "ffn_dim", "heads", "seed")},
        "data": data, "tokens_per_S": tokens_s, "tensors": results["fp32"]["objective"]["tensors"], "flops": flops,
        "flops_per_forward": {k: v / flops["forward_S"] for k, v in flops.items()},
        "peak_tflops": peaks, "peak_source": peak_source,
        "fp16_update": {**train, "floor_s": flops["train_update_S"] / (peaks["fp16"] * 1e12) if peaks else None},
        "precisions": rows, "phase": {"iterations": PHASE_ITERS, "objective_share": OBJECTIVE_SHARE},
        "fp32_scale_movement": fp32_moves, "notes": notes, "wall_s": time.perf_counter() - start,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or f"gpu_phase_{device.type}{'_tiny' if args.tiny else ''}"
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1))
    md = markdown(report, tag)
    (out / f"{tag}.md").write_text(md)
    print(md)  # noqa: T201
    return report


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _pair(d, key, fmt):
    """``"objective / constraint"`` of ``d[branch][key]`` (``-`` where not measured)."""
    return " / ".join(_f(None if d.get(b) is None else d[b].get(key), fmt) for b in BRANCHES)


def markdown(report, tag):
    t = report["fp16_update"]
    tp = t.get("profile") or {}
    train_floor = "" if t["floor_s"] is None else f" (floor {t['floor_s'] * 1e3:.2f} ms)"
    st = report["settings"]
    lines = [
        f"### {tag}: {report['device']}, torch {report['torch']}, {st['layers']}+{st['layers']} layers "
        f"d={st['embed_dim']}, {report['tokens_per_S']:.0f} tokens in S, {st['iters']} timed iterations per branch",
        "",
        f"fp16 training update on S (model.half(), fp32 master weights, Adam; batches seen before; cuDNN attention "
        f"{st['cudnn_sdpa']}): {t['seconds'] * 1e3:.2f} ms{train_floor}, peak {_f(t['peak_mib'], '.0f')} MiB, GPU busy "
        f"{_f(tp.get('gpu_busy_ms'), '.2f')} ms, {_f(tp.get('launches'), '.0f')} kernel launches, "
        f"{_f(tp.get('aten_ops'), '.0f')} aten operators.",
        "",
        "| precision | objective ms | / fp16 update | constraint ms | / fp16 update | peak MiB obj / con | "
        "780-iteration phase s (floor) | max rel. scale diff vs fp32 obj / con | GPU busy ms obj / con | "
        "kernel launches obj / con | aten ops obj / con | host reads / syncs obj / con |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, r in report["precisions"].items():
        floor = r.get("projected_phase_floor_s")
        d = r["max_rel_scale_diff_vs_fp32"]
        s, reads, prof = r["host_syncs_per_iteration"], r["host_reads_per_iteration"], r["profile_per_iteration"]
        lines.append(
            f"| {p} | {r['objective_s'] * 1e3:.2f} | {r['objective_per_fp16_update']:.2f} | "
            f"{r['constraint_s'] * 1e3:.2f} | {r['constraint_per_fp16_update']:.2f} | "
            f"{_f(r['objective_peak_mib'], '.0f')} / {_f(r['constraint_peak_mib'], '.0f')} | "
            f"{r['projected_phase_s']:.1f} ({_f(floor, '.1f')}) | {d['objective']:.2e} / {d['constraint']:.2e} | "
            f"{_pair(prof, 'gpu_busy_ms', '.1f')} | {_pair(prof, 'launches', '.0f')} | {_pair(prof, 'aten_ops', '.0f')} | "
            f"{_f(reads['objective'], 'd')} / {_f(s['objective'], 'd')}, {_f(reads['constraint'], 'd')} / "
            f"{_f(s['constraint'], 'd')} |")
    f = report["flops_per_forward"]
    moved = report["fp32_scale_movement"]
    lines += [
        "",
        f"Counted FLOPs per forward pass over S: {report['flops']['forward_S'] / 1e9:.3g} GFLOP; training update "
        f"(forward + backward) {f['train_update_S']:.2f}x, objective iteration {f['objective']:.2f}x, constraint "
        f"iteration (second-order graph reused) {f['constraint']:.2f}x. Floor: those FLOPs at the dense peak of the "
        f"dtype ({report['peak_source'] or 'no peak known for this device'}). Phase: {report['phase']['iterations']} "
        f"iterations, {100 * report['phase']['objective_share']:.0f}% objective. The fp32 scales moved by up to "
        f"{moved['objective']:.3g} (objective) / {moved['constraint']:.3g} (constraint) from 1.",
    ]
    lines += [f"Note: {n}." for n in report["notes"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    logging.getLogger("fairseq_gradinit").setLevel(logging.WARNING)  # one line per run is enough
    main(get_args_parser().parse_args())
