#!/usr/bin/env python3
"""The benchmark numbers of docs/fairseq.md, benchmarks/README.md and docs/vision.md, generated from the stored results
(``benchmarks/results/*.json``), so that the prose cannot drift from the measurements.

A generated block sits between ``<!-- bench:NAME -->`` and ``<!-- /bench -->`` (a table, or a few words inside a
sentence); NAME is one of :data:`BLOCKS`.

    python scripts/benchmark_tables.py           # print every block
    python scripts/benchmark_tables.py --write   # update docs/fairseq.md, benchmarks/README.md, docs/vision.md
    python scripts/benchmark_tables.py --check   # exit 1 if a file is out of date (the tests run this)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FILES = ("docs/fairseq.md", "benchmarks/README.md", "docs/vision.md", "README.md", "docs/monitor.md")
BLOCK = re.compile(r"<!-- bench:([\w.]+) -->(.*?)<!-- /bench -->", re.S)

# (label, result key, ratio key of the time, ratio key of the memory, target key of the time, of the memory)
TRANSFORMER_ROWS = (
    ("training step (fwd+bwd+Adam)", "train_step", None, None, None, None),
    ("objective iteration", "gradinit_objective", "objective_time", "objective_peak_memory", "objective_time",
     "objective_peak_memory"),
    ("constraint iteration after a constraint iteration", "gradinit_constraint", "constraint_time",
     "constraint_peak_memory", "constraint_time", None),
    ("constraint iteration after an objective iteration", "gradinit_constraint_switch", "constraint_switch_time",
     "constraint_switch_peak_memory", "constraint_time", None),
    ("constraint iteration, `constraint_grad=\"finite_difference\"` (opt-in, approximate)", "gradinit_constraint_fd",
     "constraint_fd_time", "constraint_fd_peak_memory", "constraint_time", None),
)


def load(tag: str) -> dict:
    return json.loads((RESULTS / f"{tag}.json").read_text(encoding="utf-8"))


def mark(value: float, target, unit: str = "") -> str:
    """``value`` with 2 decimals and ``unit``, and ✓/✗ against ``target`` (an upper bound) when there is one."""
    return f"{value:.2f}{unit}" + ("" if target is None else (" ✓" if value <= target else " ✗"))


def transformer_table(tag: str) -> str:
    d = load(tag)
    ratios, targets = d["ratios"], d["targets"]
    train = d["results"]["train_step"]
    lines = ["| measurement | time (ms) | time / train step | peak memory / train step | target |",
             "|---|---|---|---|---|"]
    for label, key, t_key, m_key, t_target, m_target in TRANSFORMER_ROWS:
        if key not in d["results"]:
            continue
        ms = 1000 * d["results"][key]["median_s"]
        if t_key is None:
            lines.append(f"| {label} | {ms:.0f} | 1.00 | 1.00 ({train['peak_bytes'] / 2**20:.0f} MiB) | |")
            continue
        tt, mt = targets.get(t_target), targets.get(m_target) if m_target else None
        target = ", ".join(x for x in (f"≤ {tt:g} time" if tt else "", f"≤ {mt:g} memory" if mt else "") if x)
        lines.append(f"| {label} | {ms:.0f} | {mark(ratios[t_key], tt)} | {mark(ratios[m_key], mt)} | {target} |")
    share = d["recipe_share"]
    lines.append("")
    lines.append(f"Projected share of the paper's recipe (780 GradInit iterations + 100k updates): "
                 f"{100 * share['all_objective']:.2f}% if every iteration is an objective one, "
                 f"{100 * share['all_constraint']:.2f}% if every one is a constraint one (target ≤ "
                 f"{100 * targets['recipe_share']:g}%). Device: {d['device']}, torch {d['torch']}.")
    return "\n" + "\n".join(lines) + "\n"


def vision_table(tag: str) -> str:
    d = load(tag)
    t = d["targets"]
    with_fd = any("constraint_fd_time" in r["ratios"] for r in d["results"])
    head = ["model", "BN", "train ms", f"objective time (≤ {t['objective_time']:g})",
            f"constraint time (≤ {t['constraint_time']:g})", f"objective memory (≤ {t['objective_memory']:g})"]
    if with_fd:
        head.append(f"constraint time, finite_difference (≤ {t['constraint_time']:g})")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in d["results"]:
        q = r["ratios"]
        row = [r["model"], "yes" if r["bn"] else "no", f"{1000 * r['train']['time_s']:.1f}",
               mark(q["objective_time"], t["objective_time"], "×"), mark(q["constraint_time"], t["constraint_time"], "×"),
               mark(q["objective_memory"], t["objective_memory"], "×")]
        if with_fd:
            row.append(mark(q["constraint_fd_time"], t["constraint_time"], "×") if "constraint_fd_time" in q else "")
        lines.append("| " + " | ".join(row) + " |")
    c = d["config"]
    lines.append("")
    lines.append(f"Device: {d['device']}, torch {d['torch']}; batch {c['batch_size']} (|S| = |S̃| = {c['batch_size']}), "
                 f"{c['image_size']}×{c['image_size']} inputs, width {c['width']:g}, median of {c['repeats']} timed "
                 f"calls. Peak memory: {d['memory_method']}.")
    return "\n" + "\n".join(lines) + "\n"


def ratio_range(tags: List[str], keys: List[str]) -> str:
    """``a–b×``: the smallest and largest of the ratios ``keys`` over the results ``tags``."""
    values = []
    for tag in tags:
        d = load(tag)
        rows = d["results"] if isinstance(d["results"], list) else [d]
        values += [r["ratios"][k] for r in rows for k in keys if k in r["ratios"]]
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low}×" if low == high else f"{low}–{high}×"


#: The CUDA runtime and driver calls that launch work, as torch.profiler names them (as bench_gpu_phase.py counts).
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.1f}"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def gpu_phase_table(tag: str) -> str:
    """The table of ``bench_gpu_phase.py``: per precision the iteration times, the projected phase
    against its floor and the per-iteration profile (from the JSON itself, or for runs that predate
    it from the torch.profiler counts of a separate run stored with it). A missing result is said so."""
    if not (RESULTS / f"{tag}.json").exists():
        return (f"\nNot measured yet: `results/{tag}.json` is written by the command above.\n")
    d = load(tag)
    extra = d.get("separate_profile", {}).get("runs", {})
    lines = ["| precision | objective ms | constraint ms | / fp16 update obj / con | 780-iteration phase s | "
             "FLOP floor s | GPU busy ms obj / con | kernel launches obj / con | host syncs obj / con |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p, r in d["precisions"].items():
        prof = r.get("profile_per_iteration") or {}
        busy, launches = [], []
        for b in ("objective", "constraint"):
            row = prof.get(b) or {}
            old = extra.get(f"{p}-{b}")
            if old is not None:  # the separate profile: launches are the runtime API's launch calls
                api = old["api_counts_per_iter"]
                row = {"gpu_busy_ms": old["device_busy_ms_per_iter"],
                       "launches": sum(api.get(k, 0) for k in LAUNCH_APIS)}
            busy.append(_num(row.get("gpu_busy_ms"), ".0f"))
            launches.append(_num(row.get("launches"), ".0f"))
        syncs = r["host_syncs_per_iteration"]
        lines.append(f"| {p} | {_ms(r['objective_s'])} | {_ms(r['constraint_s'])} | "
                     f"{r['objective_per_fp16_update']:.2f} / {r['constraint_per_fp16_update']:.2f} | "
                     f"{r['projected_phase_s']:.1f} | {_num(r.get('projected_phase_floor_s'), '.1f')} | "
                     f"{' / '.join(busy)} | {' / '.join(launches)} | "
                     f"{_num(syncs['objective'], 'd')} / {_num(syncs['constraint'], 'd')} |")
    t, st = d["fp16_update"], d["settings"]
    tp = t.get("profile") or {}
    sdpa = f", cuDNN attention {st['cudnn_sdpa']}" if "cudnn_sdpa" in st else ""
    lines += ["", f"fp16 training update: {_ms(t['seconds'])} ms (floor {_ms(t['floor_s'])} ms{sdpa}"
              f"{', timed on batches seen before' if 'profile' in t else ', every timed batch a new shape'}), "
              f"GPU busy {_num(tp.get('gpu_busy_ms'), '.1f')} ms, {_num(tp.get('launches'), '.0f')} kernel launches. "
              f"Device: {d['device']}, torch {d['torch']}; {d['tokens_per_S']:.0f} tokens in S, "
              f"{st['layers']}+{st['layers']} layers d={st['embed_dim']}, {st['iters']} timed iterations per branch."]
    return "\n" + "\n".join(lines) + "\n"


def ops_table(tag: str, labels: Dict[str, str]) -> str:
    """aten operators per iteration (torch.profiler on the CPU) of ``bench_gpu_phase.py`` reports
    stored under the keys of ``labels`` in one result file."""
    runs = load(tag)
    lines = ["| engine | aten ops obj / con | of them not views obj / con | aten::mul obj / con | aten::dot obj / con "
             "| host reads obj / con |", "|---|---|---|---|---|---|"]
    for key, label in labels.items():
        r = runs[key]["precisions"]["fp32"]
        prof, reads = r["profile_per_iteration"], r["host_reads_per_iteration"]
        cells = [" / ".join(f"{prof[b][k]:.0f}" for b in ("objective", "constraint"))
                 for k in ("aten_ops", "aten_kernels", "aten_mul", "aten_dot")]
        lines.append(f"| {label} | {' | '.join(cells)} | {reads['objective']} / {reads['constraint']} |")
    d = runs[key]
    st = d["settings"]
    lines += ["", f"Device: {d['device']}, torch {d['torch']}; {st['layers']}+{st['layers']} layers "
              f"d={st['embed_dim']}, {d['tensors']} parameter tensors, {d['tokens_per_S']:.0f} tokens in S, "
              f"{st['profile_iters']} profiled iteration(s) per branch."]
    return "\n" + "\n".join(lines) + "\n"


#: Rows of the end-to-end phase benchmark (``bench_phase_e2e.py``), by iteration kind.
PHASE_E2E_LABELS = {"objective": "objective iteration",
                    "constraint": "constraint iteration after a constraint iteration",
                    "constraint_after_objective": "constraint iteration after an objective iteration"}


def phase_e2e_markdown(d: dict, *, iteration_targets: bool = True) -> str:
    """The table of ``bench_phase_e2e.py``'s report ``d``: per iteration kind its wall time, tokens and
    per-token cost against the training updates of the same run, and the phase's extra work.
    ``iteration_targets``: mark the iterations against the targets (set for the paper's iteration kinds)."""
    u, t = d["update"], d["targets"]
    lines = ["| measurement | n | ms | tokens S / S̃ | ms per 1k tokens | per token / update | same, CPU time "
             "| per iteration / update | data / fwd / bwd / rest ms | target |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines.append(f"| training update | {u['count']} | {1000 * u['wall_s']:.0f} | {u['tokens']:.0f} | "
                 f"{1e6 * u['wall_s_per_token']:.1f} | 1.00 | 1.00 | 1.00 | | |")
    targets = ({"objective": t["objective_per_token_ratio"], "constraint": t["constraint_per_token_ratio"]}
               if iteration_targets else {})
    for kind, label in PHASE_E2E_LABELS.items():
        k = d["kinds"].get(kind)
        if not k:
            continue
        w = k["where"]
        toks = f"{k['tokens_s']:.0f}" + (f" / {k['tokens_s_tilde']:.0f}" if k["tokens_s_tilde"] is not None else "")
        target = targets.get(kind)
        cpu = k.get("cpu_per_token_ratio")
        lines.append(f"| {label} | {k['count']} | {1000 * k['wall_s']:.0f} | {toks} | {1e6 * k['wall_s_per_token']:.1f} | "
                     f"{mark(k['per_token_ratio'], target)} | {_num(cpu, '.2f')} | {k['per_update_ratio']:.2f} | "
                     f"{1000 * w['data']:.0f} / {1000 * w['forward']:.0f} / {1000 * w['backward']:.0f} / "
                     f"{1000 * w['bookkeeping']:.0f} | {'' if target is None else f'≤ {target:g} per token'} |")
    s, share = d["sections_s"], d["extra_share"]
    lines += ["", f"Phase: {d['iterations']} iterations in {d['phase_s']:.1f} s. Its extra work: health check "
              f"{s['health']:.2f} s, weights snapshot {s['snapshot']:.2f} s, fingerprint {s['fingerprint']:.2f} s, "
              f"batch plan {s['batch_plan']:.2f} s, state saves {s['state_save']:.2f} s, logging {s['logging']:.2f} s, "
              f"result file {s['result_write']:.2f} s: {mark(100 * share, 100 * t['extra_share'], '%')} of the phase "
              f"(target ≤ {100 * t['extra_share']:g}%). Pairs drawn and collated: {s['data'] + s['collate']:.2f} s. "
              f"Device: {d['device']}, torch {d['torch']}."]
    return "\n".join(lines) + "\n"


def phase_e2e_table(tag: str, *, iteration_targets: bool = True) -> str:
    """:func:`phase_e2e_markdown` of ``results/<tag>.json``; a missing result is said so."""
    if not (RESULTS / f"{tag}.json").exists():
        return f"\nNot measured yet: `results/{tag}.json` is written by the command above.\n"
    return "\n" + phase_e2e_markdown(load(tag), iteration_targets=iteration_targets)


def default_phase_cost(tag: str, iterations: int = 200) -> str:
    """A phase of ``iterations`` objective iterations of ``results/<tag>.json`` (the plugin's default objective:
    almost every iteration of its phases is one) in training updates of the same run."""
    if not (RESULTS / f"{tag}.json").exists():
        return f"not measured yet (`results/{tag}.json`)"
    ratio = load(tag)["kinds"]["objective"]["per_update_ratio"]
    return (f"{ratio:.2f} training updates per objective iteration, so a {iterations}-iteration phase costs about "
            f"{ratio * iterations:.0f} updates' time")


def compare_vision_payoff() -> str:
    """The stored runs of ``gradinit-compare-vision``'s default command as a range over the machines measured
    (the command prints the same sentence beside its own numbers)."""
    from fairseq_gradinit.tools.compare_vision import payoff_line, payoff_range, stored_results

    return payoff_line(payoff_range(stored_results()))


def compare_vision_times() -> str:
    """The wall time of both runs of each stored default comparison, by machine."""
    from fairseq_gradinit.core.progress import format_duration
    from fairseq_gradinit.tools.compare_vision import stored_results

    times = [format_duration(r["wall_time"]) for r in stored_results()]
    return " and ".join(times)


def demo_runs() -> str:
    """The stored ``gradinit-demo`` runs, one sentence per machine: each run's validation loss and source gap at
    its last update, and the wall time of the whole demo."""
    from fairseq_gradinit.tools.demo import ARMS, stored_runs

    parts = []
    for r in stored_runs():
        arms = "; ".join(f"{ARMS[a]}: loss {r['arms'][a]['final_loss']:.3f}, source gap {r['arms'][a]['final_src_gap']:.3f}"
                         for a in ARMS)
        m, s = divmod(round(r["wall_s"]), 60)
        parts.append(f"{arms} (update {r['arms']['xavier']['last_update']}; the whole demo {m}m{s:02d}s on a "
                     f"{r['machine']['cores']}-core {r['machine']['cpu']})")
    return "; ".join(parts) or "not measured yet"


def source_gap_cost() -> str:
    """The measured cost of the source gap at validation (``docs/source-gap-cost.json``), one sentence."""
    d = json.loads((REPO / "docs" / "source-gap-cost.json").read_text(encoding="utf-8"))
    a, b, r = d["wall_s"]["a"], d["wall_s"]["b"], d["ratio_a_over_b_wall"]
    v, m = d["validation"], d["machine"]
    return (f"on the quick-start model's validation split ({v['sentences']:,} sentences, {v['target_tokens']:,} target "
            f"tokens), `fairseq-validate` took {a['median']:.1f} s with the gap and {b['median']:.1f} s without it "
            f"(medians of 3 whole-process runs each, the dropout-on loss scored in both; paired ratio {r['median']:.2f}, "
            f"{r['min']:.2f}–{r['max']:.2f}) on one thread of a {m['cores']}-core {m['cpu']}, with other work at the "
            f"lowest priority beside it")


def bleu_decode_markdown(d: dict) -> str:
    """The table of ``bench_bleu_decode.py``'s report ``d``: per case the decode path, the decodes at once, the wall
    and processor time (start-up included), the start-up and the rate after it, BLEU, and the wall time over the
    first case's."""
    lines = ["| case | decode | at once | wall (s) | CPU (s) | start-up (s) | sentences/s after start-up | BLEU "
             "| wall / first case |", "|---|---|---|---|---|---|---|---|---|"]
    first = d["cases"][0]["wall_s"] if d["cases"] else None
    for c in d["cases"]:
        one = c["decodes"][0]
        decode = one.get("decode") or {}
        module = f" ({c['generate_module']})" if c.get("generate_module") else ""
        lines.append(f"| {c['name']} | {c.get('path', 'in-process')}{module} | {c['at_once']} | {c['wall_s']:.1f} "
                     f"| {sum(x['cpu_s'] for x in c['decodes']):.1f} | {_num(decode.get('startup_s'), '.1f')} "
                     f"| {_num(decode.get('sentences_per_s'), '.1f')} | {_num(one.get('bleu'), '.2f')} "
                     f"| {c['wall_s'] / first:.2f} |")
    return "\n".join(lines) + "\n"


def bleu_decode_table(tag: str) -> str:
    """:func:`bleu_decode_markdown` of ``results/<tag>.json`` and its note; a missing result is said so."""
    if not (RESULTS / f"{tag}.json").exists():
        return f"\nNot measured yet: `results/{tag}.json` is written by the command above.\n"
    d = load(tag)
    note = f"\n{d['note']}\n" if d.get("note") else ""
    return "\n" + bleu_decode_markdown(d) + note


def quickstart_thread_speedup() -> str:
    """How much faster the vision quick start ran with one thread than with PyTorch's default, over the stored
    measurements (``docs/threads-quickstart*.json``); the loaded file's run with a core busy is left out, its load
    changed during it (docs/quickstart-vision.md says so)."""
    ratios = []
    for name in ("threads-quickstart.json", "threads-quickstart-loaded.json"):
        rows = json.loads((REPO / "docs" / name).read_text(encoding="utf-8"))["runs"]
        for busy in (False, True):
            t = {r["setting"]: r["seconds"] for r in rows if r["one_core_busy"] == busy}
            ratios.append(t["default threads"] / t["OMP_NUM_THREADS=1"])
    kept = ratios[:3]
    return f"{min(kept):.1f}–{max(kept):.1f}× faster"


def fmnist_gpu_resnet110() -> str:
    """The GPU runs of the full-width ResNet-110 without normalization (``docs/fmnist-gpu-results.json``): Kaiming's
    accuracy after one epoch (both seeds) and GradInit's (each seed)."""
    gpu = json.loads((REPO / "docs" / "fmnist-gpu-results.json").read_text(encoding="utf-8"))
    kaiming = sorted({gpu[f"resnet110--no-bn-kaiming-s{s}"]["acc_1"] for s in (0, 1)})
    g = sorted(gpu[f"resnet110--no-bn-gradinit-s{s}"]["acc_1"] for s in (0, 1))
    start = (f"stays at chance level ({kaiming[0]:.2f} %)" if kaiming == [10.0]
             else "reaches " + " and ".join(f"{k:.2f} %" for k in kaiming))
    return f"{start} from Kaiming's initialization and reaches {g[0]:.2f} % and {g[1]:.2f} % (two seeds)"


TRANSFORMER_TIME_KEYS = ["objective_time", "constraint_time", "constraint_switch_time"]

#: name -> renderer of each generated block.
BLOCKS: Dict[str, Callable[[], str]] = {
    "transformer_cpu_B2048": lambda: transformer_table("transformer_cpu_B2048"),
    "transformer_cuda_B4096": lambda: transformer_table("transformer_cuda_B4096"),
    "vision_cpu": lambda: vision_table("vision_cpu"),
    "vision_cuda": lambda: vision_table("vision_cuda"),
    "gpu_phase_cuda_4310047": lambda: gpu_phase_table("gpu_phase_cuda_4310047"),
    "gpu_phase_cuda": lambda: gpu_phase_table("gpu_phase_cuda"),
    "phase_e2e_cpu": lambda: phase_e2e_table("phase_e2e_cpu"),
    "phase_e2e_cpu_fd": lambda: phase_e2e_table("phase_e2e_cpu_fd"),
    # the targets are the paper's iteration's: the default's objective simulates four steps
    "phase_e2e_cpu_look4": lambda: phase_e2e_table("phase_e2e_cpu_look4", iteration_targets=False),
    "phase_e2e_cpu_look4.default_phase": lambda: default_phase_cost("phase_e2e_cpu_look4"),
    "bleu_decode_cpu": lambda: bleu_decode_table("bleu_decode_cpu"),
    "compare_vision.payoff": compare_vision_payoff,
    "demo.runs": demo_runs,
    "monitor.source_gap_cost": source_gap_cost,
    "compare_vision.times": compare_vision_times,
    "quickstart.thread_speedup": quickstart_thread_speedup,
    "fmnist_gpu.resnet110": fmnist_gpu_resnet110,
    "gpu_phase_ops_cpu": lambda: ops_table("gpu_phase_ops_cpu", {"before": "per-tensor (`4310047`)",
                                                                 "after": "flat buffers (full Hessian-vector products)"}),
    "transformer_cpu.iteration_range": lambda: ratio_range(["transformer_cpu_B2048"], TRANSFORMER_TIME_KEYS),
    "transformer_cuda.iteration_range": lambda: ratio_range(["transformer_cuda_B4096"], TRANSFORMER_TIME_KEYS),
    "vision_cpu.constraint_range": lambda: ratio_range(["vision_cpu"], ["constraint_time"]),
    "vision_cuda.constraint_range": lambda: ratio_range(["vision_cuda"], ["constraint_time"]),
    "transformer_cpu.fd_vs_exact": lambda: (
        f"{ratio_range(['transformer_cpu_B2048'], ['constraint_fd_time'])} a training step and "
        f"{load('transformer_cpu_B2048')['ratios']['constraint_fd_peak_memory']:.2f}× its memory, against "
        f"{ratio_range(['transformer_cpu_B2048'], ['constraint_time', 'constraint_switch_time'])} and "
        f"{load('transformer_cpu_B2048')['ratios']['constraint_peak_memory']:.2f}× for the exact gradient"),
}


def render(text: str) -> str:
    """``text`` with every generated block replaced; a ``ValueError`` names an unknown block."""
    def replace(m):
        name = m.group(1)
        if name not in BLOCKS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(sorted(BLOCKS))}")
        return f"<!-- bench:{name} -->{BLOCKS[name]()}<!-- /bench -->"
    return BLOCK.sub(replace, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="update the generated blocks of the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated block is out of date")
    args = p.parse_args(argv)
    if not (args.write or args.check):
        for name, fn in BLOCKS.items():
            print(f"## {name}\n{fn()}\n")
        return 0
    from generated import update_generated  # scripts/generated.py, beside this script

    return update_generated(REPO, FILES, render, write=args.write, tool="benchmark_tables")

if __name__ == "__main__":
    sys.exit(main())
