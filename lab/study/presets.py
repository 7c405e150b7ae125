"""Presets of the study runner (``python -m lab.study --preset NAME``; ``--list-presets`` says what each answers).

The presets are data: ``lab/study/preset_data/common.toml`` (the listing order and the argument groups several
presets share) and one ``NAME.toml`` per preset (its base, arms, calls and texts), read and checked by
:mod:`.preset_schema`, which documents the schema and the reference syntax. This module loads them once and
keeps the names other code imports: the presets (``TESTBED``, ...), the groups they read by name (``D512_BASE``,
``GI_AUTHORS``, ...; every group is in :data:`GROUPS`), and the functions that list and estimate them.
"""
from __future__ import annotations

import shlex
import textwrap
from typing import Dict, Optional, Tuple

from . import preset_schema
from .preset_schema import Preset, StudyCall, load_presets, seed_twin  # noqa: F401  (imported from here)

_LIBRARY = load_presets()
PRESETS: Dict[str, Preset] = dict(_LIBRARY.presets)
#: Every named argument group of the data files, resolved to its tokens.
GROUPS: Dict[str, Tuple[str, ...]] = dict(_LIBRARY.groups)

EVIDENCE, SCREEN, DEMO, ABLATE, CONFIRM, WSKIP, HOLD, SHOCK, TESTBED, LM, CONVERGE = (PRESETS[n] for n in (
    "evidence", "screen", "demo", "ablate", "confirm", "wskip", "hold", "shock", "testbed", "lm", "converge"))
# Groups that tests and the docs' tables read by name.
D512_BASE = GROUPS["D512_BASE"]
D128_BASE = GROUPS["D128_BASE"]
WARMUP_4000 = GROUPS["WARMUP_4000"]
GI_AUTHORS = GROUPS["GI_AUTHORS"]
#: The recipe's values that :data:`GI_AUTHORS` leaves out, and why: ``field -> reason``.
GI_AUTHORS_LEFT_OUT = _LIBRARY.left_out["GI_AUTHORS"]
LM_BASE = GROUPS["LM_BASE"]
GI_LM = GROUPS["GI_LM"]
#: Updates of a converge arm (its linear decay reaches 0 there).
CONVERGE_UPDATES = CONVERGE.max_update


def paper_defaults(train_lr: float) -> Tuple[str, ...]:
    """What the plugin's Adam defaults were before its no-warmup setting (the data's ``@paper_defaults(LR)``):
    one simulated step, gamma by the plugin's rule (1/eta, eta = 2 x ``train_lr``) and the authors' tau 2.5e-3."""
    return preset_schema.paper_defaults(train_lr, GROUPS["PAPER_STEP"])


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)} (see --list-presets)")
    return PRESETS[name]


def call_estimate(preset: Preset, call: StudyCall):
    """The estimated duration of a preset's call with its own settings (None without them or without
    throughput figures for the preset's setting); arms prepared by the preset's earlier calls are cached."""
    from .estimate import THROUGHPUT, call_jobs, estimate_call

    if preset.throughput is None or call.parallel is None or call.repeat_seed is not None:
        return None  # a repeat call's arms are named on its command line: --dry-run estimates them
    earlier = preset.calls[:preset.calls.index(call)]
    cached = {name for c in earlier for name in c.prepare}  # their scales come with the cache
    jobs = call_jobs(preset.arms, call.arms, call.prepare, preset.base, max_update=preset.max_update, cached=cached)
    bleu_s = (call.bleu_budget or 0.0) * 60.0
    return estimate_call(jobs, throughput=THROUGHPUT[preset.throughput], parallel=call.parallel,
                         time_budget_s=None if call.time_budget is None else call.time_budget * 60.0,
                         finish_margin_s=30.0 if call.finish_margin is None else call.finish_margin,
                         bleu_s=bleu_s, bleu_budget_s=bleu_s, limit_s=call.limit_s)


def how_long(preset: Preset) -> str:
    """How long a preset takes, in a line: its calls' estimates, else what was measured or planned."""
    parts, repeats = [], []
    for c in preset.calls:
        est = call_estimate(preset, c)
        if est is not None:
            parts.append(f"{c.name} ~{est.total_s:.0f} s")
        elif c.repeat_seed is not None:
            repeats.append(f"; call {c.name} (seed {c.repeat_seed} of the arms you name): --dry-run estimates it")
    if parts:
        limits = {c.limit_s for c in preset.calls if c.limit_s is not None}
        limit = f" (each within {max(limits):.0f} s)" if limits else ""
        return (f"calls {', '.join(parts)} on one {(preset.throughput or '').upper()} by the estimate{limit}"
                + "".join(repeats))
    return preset.takes or preset.duration or "not measured"


def list_presets() -> str:
    """What ``--list-presets`` prints: per preset what it answers, how long it takes and where it is
    documented (``--list-presets NAME`` describes one in full)."""
    out = ["Presets (python -m lab.study DATA --preset NAME; --list-presets NAME shows its arms and calls):", ""]
    for p in PRESETS.values():
        out.append(textwrap.fill(f"{p.name}: " + (p.answers or p.summary), 100, subsequent_indent="    "))
        out.append(textwrap.fill("takes: " + how_long(p), 100, initial_indent="    ", subsequent_indent="      "))
        if p.docs:
            out.append(f"    docs: {p.docs}")
    return "\n".join(out)


def describe_presets(names: Optional[Tuple[str, ...]] = None) -> str:
    """What ``--list-presets NAME`` prints: per preset its summary, base, arms, calls and notes."""
    out = []
    for p in (PRESETS[n] for n in (names or tuple(PRESETS))):
        out.append(f"== {p.name}: {p.summary}")
        out.append(f"   max-update {p.max_update}, valid-every {p.valid_every}, save-every {p.save_every}")
        out.append("   base: " + shlex.join(p.base))
        for k, v in p.files.items():
            out.append(f"   file {{{k}}} default: {v} (--file {k}=PATH)")
        for a in p.arms:
            out.append(f"   arm {a.spec()}")
            if a.note:
                out.append(f"       {a.note}")
        for c in p.calls:
            prep = f"; prepares {','.join(c.prepare)}" if c.prepare else ""
            trains = (f"the seed-{c.repeat_seed} twins of the arms you name" if c.repeat_seed is not None
                      else ",".join(c.arms))
            out.append(f"   call {c.name}: trains {trains}{prep}" + (f" ({c.note})" if c.note else ""))
            est = call_estimate(p, c)
            if est is not None:
                bound = f", at most {est.upper_bound_s:.0f} s" if est.upper_bound_s is not None else ""
                limit = (f"; limit {est.limit_s:.0f} s: {'fits' if est.fits else 'DOES NOT FIT'}"
                         if est.limit_s is not None else "")
                out.append(f"       expected duration on one {est.throughput.name.upper()}: ~{est.total_s:.0f} s"
                           f"{bound}{limit} (--parallel {c.parallel} --time-budget {c.time_budget:g} "
                           f"--bleu-budget {c.bleu_budget:g} --finish-margin {c.finish_margin:g})")
        if p.duration:
            out.append(f"   duration where measured: {p.duration}")
        if p.doc:
            out.append(textwrap.indent(p.doc, "   "))
        out.append("")
    return "\n".join(out)
