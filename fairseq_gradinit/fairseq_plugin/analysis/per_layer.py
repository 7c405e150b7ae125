"""Per-layer GradInit report for a fairseq Transformer: the paper's appendix figures as JSON and PNG.

From ``fairseq-train`` arguments (data-bin, ``--arch`` ..., ``--seed``) the model is rebuilt exactly
as fairseq-train builds it before training (same seeding, same Xavier weights); a ``gradinit.json``
supplies the scales. :func:`fairseq_gradinit.core.norms_and_spread.init_report` then measures, per tensor, the
scale, the weight norm and the cross-minibatch gradient standard deviation before and after the
scales (see its module docstring for the definitions and for why gradients are taken in train mode
by default). Tensors are placed by :func:`~..features.groups.transformer_place` (encoder/decoder x layer x kind).

A consistency check recomputes GradInit's first iteration (L(S) and ||g|| on its first S batch, at the
unscaled weights, without dropout) and compares them with ``history[0]`` of the ``gradinit.json``:
agreement shows that the rebuilt weights and data are the ones GradInit ran on.
"""
from __future__ import annotations

import json
import logging
import math
import platform
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from ...core import apply_scales
from ...core.health import scale_health, snapshot_weights, swapped_weights
from ...core.modes import gradinit_mode
from ...core.norms_and_spread import ReportConfig, init_report, unique_trainable
from ...files.paths import png_metadata
from ..data.loss import mean_loss_fn
from ..data.training import FairseqModel, build_training_model, collate, training_batch_indices, training_dataset
from ..features.groups import transformer_place
from ..features.health import FAIRSEQ_STRUCTURE, batch_size, log_health
from ..features.tied import apply_multiplier_scales
from ..registration.hook import GradInitTaskMixin
from ..settings.init_file import field_problem, saved_gamma

logger = logging.getLogger(__name__)

#: Position of a kind inside a block, in the order the paper lists them (self attention, encoder
#: attention, FFN), with each LayerNorm after its sublayer (Post-LN).
KIND_ORDER = [
    "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.out", "self_attn_layer_norm",
    "encoder_attn.q", "encoder_attn.k", "encoder_attn.v", "encoder_attn.out", "encoder_attn_layer_norm",
    "fc1", "fc2", "final_layer_norm",
]
#: Panels of the figure: title -> predicate on the kind.
FAMILIES = [
    ("Query projection", lambda k: k.endswith("attn.q")),
    ("Key projection", lambda k: k.endswith("attn.k")),
    ("Value projection", lambda k: k.endswith("attn.v")),
    ("Out projection", lambda k: k.endswith("attn.out")),
    ("FFN fc1", lambda k: k == "fc1"),
    ("FFN fc2", lambda k: k == "fc2"),
    ("LayerNorm", lambda k: "layer_norm" in k or "layernorm" in k),
    ("Embeddings and other", None),  # everything the other panels do not take
]
_SHORT = {"self_attn": "s", "encoder_attn": "x", "self_attn_layer_norm": "s", "encoder_attn_layer_norm": "x",
          "final_layer_norm": "f"}


def training_batches(fm: FairseqModel, *, num_batches: int, seed: int, max_tokens: Optional[int] = None) -> List:
    """``num_batches`` distinct minibatches of the training split, length-bucketed by ``--max-tokens`` /
    ``--batch-size`` as fairseq-train and GradInit batch it (but, like GradInit's batches, without
    fairseq-train's ``--required-batch-size-multiple`` of 8), drawn at random with ``seed``."""
    cfg, task = fm.cfg, fm.task
    max_tokens = max_tokens or cfg.dataset.max_tokens
    if not max_tokens and not cfg.dataset.batch_size:
        raise ValueError("pass --max-tokens (or --batch-size) among the fairseq arguments")
    dataset = training_dataset(task, cfg.dataset.train_subset)
    batches = training_batch_indices(task, fm.model, dataset, max_tokens=max_tokens,
                                     batch_size=cfg.dataset.batch_size, seed=seed)
    if len(batches) < num_batches:
        raise ValueError(f"the training split has only {len(batches)} batches of {max_tokens} tokens; "
                         f"ask for fewer minibatches or pass a smaller --max-tokens")
    chosen = np.random.RandomState(seed).choice(len(batches), size=num_batches, replace=False)
    return [collate(dataset, batches[i], fm.device) for i in chosen]


#: The version whose GradInit batches come from the task's own training iterator.
BATCHES_CHANGED_IN = (0, 3, 0)


def version_tuple(version: str) -> tuple:
    try:
        return tuple(int(x) for x in str(version).split(".")[:3])
    except ValueError:
        return (0,)


def check_first_iteration(fm: FairseqModel, saved: dict, *, rtol_loss: float = 1e-4, rtol_norm: float = 1e-3) -> dict:
    """Recompute GradInit's iteration 1 (L(S) and ||g||_p on its first S batch at the unscaled weights)
    and compare with ``saved["history"][0]``. ||g|| is given over the scaled tensors and over every
    trainable tensor, and compared with the one the run put in g: its ``step_params`` ("all", or
    "scaled"; files written before the option existed used the scaled tensors)."""
    hist = saved.get("history") or []
    conf = saved.get("config") or {}
    if not hist or hist[0].get("loss_s") is None:
        return {"done": False, "reason": "the gradinit.json has no first-iteration record"}
    if not conf:  # the norm p and step_params of the record are the config's: without it nothing is comparable
        return {"done": False, "reason": "the gradinit.json has no 'config' (the GradInit settings that say which "
                                         "norm and tensors its first-iteration record used), so it is not compared"}
    if int(saved.get("world_size", 1)) != 1:
        return {"done": False, "reason": "GradInit ran on several ranks (the record averages their shards)"}
    written_by = (saved.get("fingerprint") or {}).get("version")
    if written_by is not None and version_tuple(written_by) < BATCHES_CHANGED_IN:
        return {"done": False, "reason": f"written by fairseq_gradinit {written_by}: GradInit drew its batches "
                                         "differently before 0.3.0 (now from the task's own training iterator), "
                                         "so its first S batch cannot be drawn again"}
    if not isinstance(fm.task, GradInitTaskMixin) or not saved.get("max_tokens"):
        return {"done": False, "reason": "needs a task served by the plugin and max_tokens in the gradinit.json"}
    pair = next(fm.task.gradinit_pairs(fm.model, int(saved["max_tokens"]), float(conf.get("overlap", 0.5)),
                                       fm.device))
    entries = unique_trainable(fm.model)
    names = [n for n, _, _ in entries]
    params = [p for _, p, _ in entries]
    alias_to_first = {a: n for n, _, al in entries for a in [n, *al]}
    scaled = {alias_to_first.get(k) for k in saved.get("scales", {})}
    p_norm = 2 if conf.get("optimizer") == "sgd" else 1
    step_params = conf.get("step_params", "scaled")
    loss_fn = mean_loss_fn(fm.criterion)
    with gradinit_mode(fm.model):
        loss = loss_fn(fm.model, pair.s)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    parts = [torch.linalg.vector_norm(g.detach().double(), p_norm) ** p_norm if g is not None else torch.zeros((), dtype=torch.float64)
             for g in grads]
    norm_scaled = float(sum(x for n, x in zip(names, parts) if n in scaled) ** (1 / p_norm))
    norm_all = float(sum(parts) ** (1 / p_norm))
    rec_loss, rec_norm = float(hist[0]["loss_s"]), float(hist[0]["grad_norm"])
    loss = float(loss.detach())
    rel_loss = abs(loss - rec_loss) / abs(rec_loss)
    rel_norm = abs((norm_all if step_params == "all" else norm_scaled) - rec_norm) / abs(rec_norm)
    return {
        "done": True, "p": p_norm, "s_sentences": int(pair.s["nsentences"]), "s_tokens": int(pair.s["ntokens"]),
        "loss_s": loss, "recorded_loss_s": rec_loss, "grad_norm_scaled_tensors": norm_scaled,
        "grad_norm_all_tensors": norm_all, "recorded_grad_norm": rec_norm, "step_params": step_params,
        "rel_diff_loss": rel_loss, "rel_diff_grad_norm": rel_norm,
        "consistent": bool(rel_loss <= rtol_loss and rel_norm <= rtol_norm),
    }


def saved_gradinit_batch(fm, saved: Mapping[str, Any]):
    """The S batch of the last GradInit iteration recorded in ``saved`` (a ``gradinit.json``), drawn
    again from the task's training data as the plugin drew it on rank 0, and a note when it cannot
    be the same batch (written by a version that drew its batches otherwise, :data:`BATCHES_CHANGED_IN`, or
    no ``max_tokens``: another training batch)."""
    conf = saved.get("config") or {}
    max_tokens = saved.get("max_tokens") or fm.cfg.dataset.max_tokens
    if not max_tokens:
        raise ValueError("pass --max-tokens among the fairseq arguments (the gradinit.json records no max_tokens)")
    n = max(1, int(saved.get("iterations") or len(saved.get("history") or ()) or 1))
    note = None
    written_by = (saved.get("fingerprint") or {}).get("version")
    if written_by is not None and version_tuple(written_by) < BATCHES_CHANGED_IN:
        note = (f"written by fairseq_gradinit {written_by}, which drew GradInit's batches differently: measured on "
                f"another training batch of {max_tokens} tokens")
        n = 1
    elif not saved.get("max_tokens"):
        note = f"the gradinit.json records no max_tokens: measured on a training batch of {max_tokens} tokens"
        n = 1
    if not isinstance(fm.task, GradInitTaskMixin):
        batch = training_batches(fm, num_batches=1, seed=int(fm.cfg.common.seed), max_tokens=int(max_tokens))[0]
        return batch, (f"the task {fm.cfg.task._name} does not draw GradInit's batches (pass the plugin's task, "
                       f"e.g. --task translation_gradinit): measured on a training batch of {max_tokens} tokens")
    pairs = fm.task.gradinit_pairs(fm.model, int(max_tokens), float(conf.get("overlap", 0.5)), fm.device,
                                   0, int(saved.get("world_size", 1) or 1))
    for _ in range(n):
        pair = next(pairs)
    return pair.s, note


def health_of_saved(fm, saved: Mapping[str, Any]) -> dict:
    """The ``health`` block of a saved ``gradinit.json`` (``saved``) for the freshly built model of
    ``fm`` (:class:`~..data.training.FairseqModel`, holding the initial weights W), measured on the S batch
    of the last recorded GradInit iteration; logged. The model is left holding W."""
    sample, note = saved_gradinit_batch(fm, saved)
    initial = snapshot_weights(fm.model)
    with swapped_weights(fm.model, initial):  # restores W on exit
        with torch.no_grad():
            apply_scales(fm.model, apply_multiplier_scales(fm.model, saved["scales"]))
        health = scale_health(fm.model, saved["scales"], lambda m: fm.criterion(m, sample), initial=initial,
                              config=saved.get("config"), loss=lambda m: mean_loss_fn(fm.criterion)(m, sample),
                              history=saved.get("history"), gamma=saved_gamma(saved), structure=FAIRSEQ_STRUCTURE)
    if note:
        health.notes.append(note)
    log_health(health)
    return {**health.to_dict(), "batch": batch_size(sample)}


def _sort_key(t: dict):
    side = {"encoder": 0, "decoder": 1}.get(t["side"], 2)
    kind = KIND_ORDER.index(t["kind"]) if t["kind"] in KIND_ORDER else len(KIND_ORDER)
    layer = -1 if t["layer"] is None else t["layer"]
    return side, layer, kind, t["kind"], t["param"]


def placed_tensors(report_dict: dict) -> List[dict]:
    """The report's tensors with their place (side, layer, kind, param), in the paper's order."""
    out = []
    for t in report_dict["tensors"]:
        place = transformer_place(t["name"])
        out.append({**t, "side": place.side, "layer": place.layer, "kind": place.kind, "param": place.param})
    return sorted(out, key=_sort_key)


def _gmean(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def group_summary(tensors: Sequence[dict]) -> Dict[str, dict]:
    """Per ``side.kind.param`` (over layers): scales (min/geometric mean/max) and the gradient std
    before/after (arithmetic means over layers, and the geometric mean of the per-tensor ratio)."""
    groups: Dict[str, List[dict]] = {}
    for t in tensors:
        groups.setdefault(f"{t['side']}.{t['kind']}.{t['param']}", []).append(t)
    out = {}
    for key, ts in groups.items():
        scales = [t["scale"] for t in ts]
        out[key] = {
            "count": len(ts),
            "layers": [t["layer"] for t in ts],
            "scale_min": min(scales), "scale_gmean": _gmean(scales), "scale_max": max(scales),
            "grad_std_before_mean": sum(t["grad_std_before"] for t in ts) / len(ts),
            "grad_std_after_mean": sum(t["grad_std_after"] for t in ts) / len(ts),
            "grad_std_ratio_gmean": _gmean([t["grad_std_after"] / t["grad_std_before"]
                                            for t in ts if t["grad_std_before"] > 0]),
            # spread relative to the mean gradient (what matters to Adam), after / before
            "relative_std_ratio_gmean": _gmean([
                (t["grad_std_after"] / t["grad_mean_abs_after"]) / (t["grad_std_before"] / t["grad_mean_abs_before"])
                for t in ts if min(t["grad_std_before"], t["grad_mean_abs_before"], t["grad_mean_abs_after"]) > 0]),
        }
    return out


def _label(t: dict, several_kinds: bool) -> str:
    side = t["side"][:1].upper()
    if t["layer"] is None:
        return f"{side}:{t['kind']}"
    if not several_kinds:
        return f"{side}{t['layer']}"
    head = t["kind"].split(".")[0]
    return f"{side}{t['layer']}{_SHORT.get(t['kind'], _SHORT.get(head, t['kind'][:2]))}"


def plot_report(tensors: Sequence[dict], path: str, *, title: str = "", dpi: int = 60,
                command: Optional[str] = None) -> None:
    """The appendix figure: per panel one kind of weight (encoder then decoder, by layer), rows:
    scale, weight norm before/after, gradient std before/after (log scale). Biases and the mean
    gradient are in the JSON only.
    Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights = [t for t in tensors if t["param"] == "weight"]
    taken, panels = set(), []
    for name, pred in FAMILIES:
        members = [t for t in weights if t["name"] not in taken and (pred is None or pred(t["kind"]))]
        taken.update(t["name"] for t in members)
        if members:
            panels.append((name, members))
    widths = [max(len(members), 8) for _, members in panels]
    fig, axes = plt.subplots(3, len(panels), figsize=(0.2 * sum(widths) + 1.5, 8.2), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for col, (name, members) in enumerate(panels):
        several = len({t["kind"] for t in members if t["layer"] is not None}) > 1 or any(
            t["layer"] is None for t in members)
        x = list(range(len(members)))
        labels = [_label(t, several) for t in members]
        rows = [
            ("scale", [t["scale"] for t in members], None),
            ("weight norm ||W||", [t["norm_before"] for t in members], [t["norm_after"] for t in members]),
            ("gradient std σ(g)", [t["grad_std_before"] for t in members], [t["grad_std_after"] for t in members]),
        ]
        for row, (ylabel, before, after) in enumerate(rows):
            ax = axes[row][col]
            if after is None:
                ax.bar(x, before, color="tab:blue")
                ax.axhline(1.0, color="black", lw=0.6)
            else:
                ax.plot(x, before, "o-", color="0.55", ms=3, lw=0.8, label="initialization")
                ax.plot(x, after, "s-", color="tab:red", ms=3, lw=0.8, label="GradInit scales")
            ax.set_yscale("log")
            if any(t["side"] == "decoder" for t in members) and any(t["side"] == "encoder" for t in members):
                ax.axvline(sum(t["side"] == "encoder" for t in members) - 0.5, color="0.8", lw=0.8)
            ax.set_xticks(x)
            ax.set_xticklabels(labels if row == 2 else [], rotation=90, fontsize=6)
            ax.tick_params(axis="y", labelsize=7)
            if row == 0:
                ax.set_title(name, fontsize=9)
            if col == 0:
                ax.set_ylabel(ylabel, fontsize=8)
    axes[1][0].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, metadata=png_metadata(command) if command else None)  # the mark of its command
    plt.close(fig)


def read_report_input(gradinit_json: str) -> dict:
    """The ``gradinit.json`` at ``gradinit_json``, or ``ValueError`` naming the file: not JSON, no scales, or a
    field that is not what the plugin writes (e.g. a ``history`` that is not a list)."""
    try:
        with open(gradinit_json, encoding="utf-8") as f:
            saved = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--gradinit-json {gradinit_json} is not a JSON file ({e}); give the gradinit.json a "
                         "--gradinit-iters run wrote") from None
    if not isinstance(saved, dict) or "scales" not in saved:
        raise ValueError(f"{gradinit_json} has no 'scales' entry: is it a gradinit.json?")
    problem = field_problem(saved)
    if problem:
        raise ValueError(f"--gradinit-json {gradinit_json}: {problem}")
    return saved


def run_report(train_argv: Sequence[str], gradinit_json: str, *, num_batches: int = 8, mode: str = "train",
               seed: Optional[int] = None, check: bool = True, device: Optional[str] = None,
               health: bool = True, health_only: bool = False) -> dict:
    """Build the model of ``train_argv``, draw ``num_batches`` training minibatches and measure the
    report (see :func:`~fairseq_gradinit.core.norms_and_spread.init_report`). With ``health``, also the
    ``health`` block of the ``gradinit.json`` (:func:`health_of_saved`); with
    ``health_only``, only that. Returns a JSON-ready dict."""
    saved = read_report_input(gradinit_json)
    start = time.time()
    fm = build_training_model(train_argv, device=device)
    seed = int(fm.cfg.common.seed if seed is None else seed)
    result: Dict[str, Any] = {}
    if check:
        result["check_first_iteration"] = check_first_iteration(fm, saved)
        logger.info("report: first-iteration check %s", result["check_first_iteration"])
    if health or health_only:
        result["health"] = health_of_saved(fm, saved)
    if health_only:
        result["meta"] = {"gradinit_json": gradinit_json, "train_args": list(train_argv), "arch": fm.cfg.model._name,
                          "seed": int(fm.cfg.common.seed), "device": str(fm.device), "torch": torch.__version__,
                          "wall_time": time.time() - start}
        return result
    batches = training_batches(fm, num_batches=num_batches, seed=seed)
    report = init_report(fm.model, saved["scales"], batches, mean_loss_fn(fm.criterion),
                         ReportConfig(mode=mode, seed=seed))
    rd = report.to_dict()
    tensors = placed_tensors(rd)
    result.update({
        "meta": {
            "gradinit_json": gradinit_json, "train_args": list(train_argv), "arch": fm.cfg.model._name,
            "seed": int(fm.cfg.common.seed), "batch_seed": seed, "num_batches": num_batches, "mode": mode,
            "max_tokens": fm.cfg.dataset.max_tokens, "batch_size": fm.cfg.dataset.batch_size,
            "batch_tokens": [int(b["ntokens"]) for b in batches],
            "batch_sentences": [int(b["nsentences"]) for b in batches],
            "loss_before": rd["loss_before"], "loss_after": rd["loss_after"],
            "device": str(fm.device), "torch": torch.__version__, "python": platform.python_version(),
            "wall_time": time.time() - start,
            "gradinit_config": saved.get("config"),
        },
        "tensors": tensors,
        "groups": group_summary(tensors),
    })
    return result
