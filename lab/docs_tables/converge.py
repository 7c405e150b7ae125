"""The headline table: the testbed's model trained to convergence (preset ``converge``), every arm by BLEU (best
checkpoint by validation loss and last), its final source gap and loss, mean and spread over its seeds, each seed
of a no-warmup arm judged against the strongest warmup baseline's run of that seed with BLEU deciding; GradInit
arms also compute-matched."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..study.presets import CONVERGE_UPDATES
from ..study.runner import best_update as best_checkpoint
from ..study.tables import comparator_of, read_curves_csv, split_arm_name
from ..study.verdict import judge
from .records import REPO, RECORD

CONVERGE = RECORD / "testbed-d128" / "converge"
#: The measured cost of one objective iteration of the default phase (four simulated steps), in training updates
#: of the same model on the same machine (``benchmarks/bench_phase_e2e.py --tag phase_e2e_cpu_look4``).
PHASE_BENCH = REPO / "benchmarks" / "results" / "phase_e2e_cpu_look4.json"
#: An arm that warms its learning rate up is a baseline; the others are the no-warmup arms being judged.
WARMUP_ARG = re.compile(r"--warmup-updates[ =]")


def _seed(name: str) -> Tuple[str, int]:
    base, seed = split_arm_name(name)
    return base, seed or 1


def updates_per_iteration(path: Path = PHASE_BENCH) -> float:
    """Training updates that one GradInit iteration of the default phase costs, as benchmarked."""
    data = json.loads(path.read_text(encoding="utf-8"))
    value = ((data.get("kinds") or {}).get("objective") or {}).get("per_update_ratio")
    if value is None:
        raise ValueError(f"{path} has no objective iteration's per_update_ratio: rerun benchmarks/bench_phase_e2e.py")
    return float(value)


def converge_runs(folder: Path = CONVERGE, updates: int = CONVERGE_UPDATES) -> List[Path]:
    """The stored studies of ``folder`` that ran the preset's length (earlier calibrations of another length
    are left out: their schedule ends elsewhere)."""
    out = []
    for d in sorted(p for p in folder.iterdir() if (p / "study.json").is_file()) if folder.is_dir() else []:
        settings = json.loads((d / "study.json").read_text(encoding="utf-8")).get("settings") or {}
        if settings.get("max_update") == updates:
            out.append(d)
    return out


def _arms(dirs: Sequence[Path]) -> Dict[str, dict]:
    """Per arm: its curves, last-checkpoint BLEU entry, best-checkpoint BLEU entry and GradInit iterations."""
    arms: Dict[str, dict] = {}
    for d in dirs:
        study = json.loads((d / "study.json").read_text(encoding="utf-8"))
        # bleu.json, refreshed when the study is stored (distinct hypotheses), else the study's own copy
        stored = json.loads((d / "bleu.json").read_text(encoding="utf-8")) if (d / "bleu.json").is_file() \
            else study.get("bleu") or {}
        bleu = stored.get("arms") or {}
        for name, curves in read_curves_csv(d / "curves.csv").items():
            args = (study.get("arms") or {}).get(name, {}).get("args", "")
            m = re.search(r"--gradinit-iters[ =](\d+)", args)
            arms[name] = {"curves": curves, "bleu": bleu.get(name) or {}, "best": (bleu.get(name) or {}).get("best"),
                          "iters": int(m.group(1)) if m else None, "batch": d.name,
                          "warmup": bool(WARMUP_ARG.search(args))}
    return arms


def best_update(curves: Mapping[str, Mapping[int, float]], save_every: int = 500) -> Optional[int]:
    """The checkpoint update with the lowest eval-mode validation loss (checkpoints every ``save_every``), as the
    study runner's ``--bleu-best`` picks it."""
    return best_checkpoint(curves, [u for u in (curves.get("valid_loss") or {}) if u % save_every == 0])


def _bleu_pair(arm: dict) -> Tuple[Optional[float], Optional[float], Optional[int]]:
    """(best, last, distinct hypotheses of the last): the best checkpoint's BLEU is the last one's where the
    best validation loss is at the last checkpoint, else what the study's ``--bleu-best`` decoded (None if it did not)."""
    last = arm["bleu"].get("bleu")
    final = max((arm["curves"].get("valid_loss") or {0: None}))
    b = best_update(arm["curves"])
    best_entry = arm["best"] or {}
    if b == final or best_entry.get("same_as_decoded"):
        best = last
    else:
        best = best_entry.get("bleu") if best_entry.get("update") == b else None
    return best, last, arm["bleu"].get("distinct_hypotheses")


def _stat(values: Sequence[Optional[float]], digits: int) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {(max(vals) - min(vals)) / 2:.{digits}f}"


def compute_matched(arm: dict, ref: dict, per_iteration: float, every: int = 250) -> str:
    """A GradInit arm at update u against its comparator at u + its phase's cost in updates (rounded up to a
    validation): eval-mode loss and source gap of both."""
    if not arm["iters"]:
        return "–"
    cost = math.ceil(arm["iters"] * per_iteration / every) * every
    a_loss, r_loss = arm["curves"].get("valid_loss") or {}, ref["curves"].get("valid_loss") or {}
    a_gap, r_gap = arm["curves"].get("valid_src_gap") or {}, ref["curves"].get("valid_src_gap") or {}
    pairs = [u for u in sorted(a_loss) if u + cost in r_loss and u in a_gap and u + cost in r_gap]
    if not pairs:
        return f"phase ≈ {cost} updates: no validation pair"
    u = pairs[-1]
    return (f"phase ≈ {cost} updates; loss {a_loss[u]:.2f} @{u} vs {r_loss[u + cost]:.2f} @{u + cost}, "
            f"gap {a_gap[u]:.2f} vs {r_gap[u + cost]:.2f}")


def _by_config(arms: Mapping[str, dict]) -> Dict[str, List[str]]:
    """Arm names grouped by their name without the seed suffix."""
    groups: Dict[str, List[str]] = {}
    for name in arms:
        groups.setdefault(_seed(name)[0], []).append(name)
    return groups


def strongest_baseline(arms: Mapping[str, dict], groups: Mapping[str, List[str]]) -> Optional[str]:
    """The comparator: of the warmup baselines (``groups`` whose every seed warms up), the one with the highest
    BLEU averaged over its seeds (each seed's best checkpoint, else its last); a reviewer compares against the
    strongest baseline, not the one that happened to run first. Ties go to the name that sorts first."""
    scored = []
    for base, names in groups.items():
        if not all(arms[n]["warmup"] for n in names):
            continue
        bleus = [b if b is not None else last for b, last, _ in (_bleu_pair(arms[n]) for n in names)]
        bleus = [b for b in bleus if b is not None]
        if bleus:
            scored.append((-sum(bleus) / len(bleus), base))
    return min(scored)[1] if scored else None


def headline_table(dirs: Sequence[Path] = ()) -> str:
    """The headline table (rows: arms by name without the seed suffix, the comparator first, then the other warmup
    baselines; mean ± half the range over seeds)."""
    dirs = list(dirs) or converge_runs()
    arms = _arms(dirs)
    groups = _by_config(arms)
    comparator = strongest_baseline(arms, groups)
    baselines = {_seed(n)[0] for n, a in arms.items() if a["warmup"]}
    strongest = "the only warmup baseline stored" if len(baselines) == 1 \
        else f"the strongest of {len(baselines)} warmup baselines"
    per_iteration = updates_per_iteration() if any(a["iters"] for a in arms.values()) else float("nan")
    head = ["arm", "seeds", "BLEU best", "BLEU last", "distinct hypotheses (last)", "source gap (last)",
            "loss (last)", "verdict per seed (BLEU decides)", "compute-matched (GradInit arms)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for base in sorted(groups, key=lambda b: (b != comparator, not arms[groups[b][0]]["warmup"], b)):
        names = sorted(groups[base], key=lambda n: _seed(n)[1])
        best, last, distinct, gaps, losses, verdicts, matched = [], [], [], [], [], [], []
        for n in names:
            b, l_, d = _bleu_pair(arms[n])
            best.append(b)
            last.append(l_)
            distinct.append(d)
            c = arms[n]["curves"]
            u = max(c.get("valid_loss") or {0: None})
            gaps.append((c.get("valid_src_gap") or {}).get(u))
            losses.append((c.get("valid_loss") or {}).get(u))
            seed = _seed(n)[1]
            ref_name = comparator_of(n, comparator) if comparator else None
            if base == comparator:
                verdicts.append(f"s{seed}: the comparator ({strongest})")
            elif arms[n]["warmup"]:
                verdicts.append(f"s{seed}: a warmup baseline")
            elif ref_name not in arms:
                verdicts.append(f"s{seed}: no comparator run of seed {seed}")
            else:
                ref = arms[ref_name]
                v = judge(n, c, ref_name, ref["curves"], bleu=l_, comparator_bleu=ref["bleu"].get("bleu"),
                          bleu_decides=True)
                verdicts.append(f"s{seed}: " + ("–" if v.holds is None else "holds" if v.holds
                                                else "fails: " + "; ".join(v.reasons)))
                if arms[n]["iters"]:
                    matched.append(f"s{seed}: " + compute_matched(arms[n], ref, per_iteration))
        lines.append("| " + " | ".join([
            f"`{base}`", ", ".join(str(_seed(n)[1]) for n in names), _stat(best, 2), _stat(last, 2),
            _stat(distinct, 0), _stat(gaps, 2), _stat(losses, 3), "; ".join(verdicts),
            "; ".join(matched) or "–"]) + " |")
    return "\n".join(lines) + "\n"
