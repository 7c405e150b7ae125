"""Presets of the study runner (``python -m lab.study --preset NAME``; ``--list-presets`` prints this).

- ``evidence``: the arms of ``lab/record/evidence/nowarmup-d512-2026-11-26`` with its settings.
- ``screen``: eight differences from the authors' setup, one arm each, plus the warmup and
  Xavier references, split into two GPU calls.
- ``demo``: the d=128 CPU demonstration of lab/record/debian-demo.md.
- ``ablate``, ``confirm``: the authors' whole setup, leave-one-out arms, and its confirmation at paper size.
- ``wskip``: Admin's w_skip Transformer against GradInit with the Admin authors' recipe.
- ``hold``: what keeps a no-warmup run alive past the collapse (lab/record/no-warmup.md, docs/remedies.md).
- ``testbed``: the d=128 CPU testbed of the no-warmup failure (lab/record/testbed-d128.md).
"""
from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

from fairseq_gradinit.core.config import first_step
from fairseq_gradinit.core.recipes import Recipe, recipe

from .arms import Arm

EVIDENCE_DIR = "lab/record/evidence/nowarmup-d512-2026-11-26"  # relative to the repository root
#: The authors' IWSLT'14 setting, declared once in the library: the presets take its values from here.
AUTHORS_RECIPE = recipe("authors-iwslt14")


def number_text(value) -> str:
    """A number as the presets' command lines spell it: ``1e-3``, ``2.5e-3``, ``1e3``, ``780``."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    mantissa, exponent = f"{value:e}".split("e")
    text = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return text if float(text) == value else repr(value)


def recipe_args(source: Recipe, names: Sequence[str]) -> Tuple[str, ...]:
    """The values ``names`` (config fields or settings) of a recipe as ``--gradinit-*`` flags, in that
    order: :meth:`~fairseq_gradinit.core.recipes.Recipe.flags`, numbers spelled by :func:`number_text`."""
    flags = source.flags()
    text = dict(zip(flags[::2], flags[1::2]))
    out: Tuple[str, ...] = ()
    for name in names:
        flag = "--gradinit-" + name.replace("_", "-")
        if flag not in text:
            raise ValueError(f"recipe {source.name!r} has no value {name!r}")
        value = source.values[name] if name in source.values else source.settings[name]
        out += (flag, number_text(value) if isinstance(value, (int, float)) else text[flag])
    return out


@dataclass(frozen=True)
class StudyCall:
    """One GPU call of a preset: the arms it trains and the arms whose GradInit scales it computes
    into the cache for a later call. ``parallel``, ``time_budget``/``bleu_budget`` (minutes) and
    ``finish_margin`` (seconds) are the defaults of ``--call NAME``; ``limit_s`` is the call's wall-time
    limit, which its estimate must fit (``--dry-run`` checks it)."""

    name: str
    arms: Tuple[str, ...]
    prepare: Tuple[str, ...] = ()
    note: str = ""
    parallel: Optional[int] = None
    time_budget: Optional[float] = None
    bleu_budget: Optional[float] = None
    finish_margin: Optional[float] = None
    limit_s: Optional[float] = None
    #: A call that repeats arms at another seed: ``--arms``/``--prepare-arms`` name the preset's arms
    #: and the call trains/prepares their twins at this seed (:func:`seed_twin`) instead of ``arms``.
    repeat_seed: Optional[int] = None


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    base: Tuple[str, ...]
    arms: Tuple[Arm, ...]
    max_update: int
    valid_every: int = 100
    save_every: int = 500
    files: Mapping[str, str] = field(default_factory=dict)  # {KEY} defaults, relative to the repo root
    calls: Tuple[StudyCall, ...] = ()
    doc: str = ""
    throughput: Optional[str] = None  # the GPU whose measured figures estimate its calls (study.estimate)
    #: How long the preset took where it was measured, for presets without throughput figures
    #: (printed by --list-presets and --dry-run).
    duration: str = ""
    #: {file key: the GradInit arguments that computed that file}: a seed twin of an arm that applies
    #: the file computes its own scales with them instead (:func:`seed_twin`).
    recompute: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    #: What the preset answers, in a sentence, and where it is documented (``--list-presets``).
    answers: str = ""
    docs: str = ""
    #: How long it takes, for presets whose calls have no estimate of their own (``--list-presets``).
    takes: str = ""
    #: Processes at once when neither ``--parallel`` nor a ``--call`` says (a CPU preset's default).
    parallel: Optional[int] = None

    def call(self, name: str) -> StudyCall:
        for c in self.calls:
            if c.name == name:
                return c
        known = ", ".join(c.name for c in self.calls) or "none"
        raise ValueError(f"preset {self.name} has no call {name!r} (calls: {known})")

    def resolved_files(self, repo_root: Path) -> Dict[str, str]:
        return {k: str((repo_root / v).resolve()) if not Path(v).is_absolute() else v for k, v in self.files.items()}


# -- the d=512 no-warmup setting of the evidence ------------------------------------------------
D512_BASE = (
    "--arch", "transformer_iwslt_de_en", "--share-all-embeddings", "--dropout", "0.3",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "fixed",
    "--max-tokens", "4096", "--seed", "1", "--fp16", "--num-workers", "1",
)
WARMUP_4000 = ("--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--warmup-init-lr", "1e-7")
BETAS_999 = ("--adam-betas", "(0.9, 0.999)")
#: The paper's single simulated step: the plugin's default with Adam is now the loss after four simulated steps.
PAPER_STEP = ("--gradinit-lookahead-steps", "1")
# GradInit as the evidence ran it: the engine then left all-zero tensors out of the simulated step
# ('scaled'; the default is now 'all', difference 3).
GI_EVIDENCE = (
    "--gradinit-iters", "780", "--gradinit-eta", "5e-4", "--gradinit-gamma", "1e3", "--gradinit-lr", "2.5e-3",
    "--gradinit-max-tokens", "4096", "--gradinit-adam-state", "per_branch", "--gradinit-step-params", "scaled",
) + PAPER_STEP


def _with(args: Tuple[str, ...], *overrides: str) -> Tuple[str, ...]:
    """``args`` with some options replaced (each option once in the command)."""
    from .arms import merge_args

    return tuple(merge_args(args, overrides))


def paper_defaults(train_lr: float) -> Tuple[str, ...]:
    """What the plugin's Adam defaults were before its no-warmup setting, for the presets that record runs made
    with them: one simulated step, gamma by the plugin's rule (1/eta, eta = 2 x ``train_lr``) and the authors'
    tau 2.5e-3."""
    gamma = first_step("adam", train_lr, rule="fairseq").gamma
    return ("--gradinit-gamma", repr(gamma)) + recipe_args(AUTHORS_RECIPE, ("lr",)) + PAPER_STEP


def _gi(*overrides: str) -> Tuple[str, ...]:
    """The evidence's GradInit arguments with some of them replaced."""
    return _with(GI_EVIDENCE, *overrides)


EVIDENCE = Preset(
    name="evidence",
    answers=("the first d=512 no-warmup evidence again: Xavier and GradInit with the paper's settings and shared "
             "embeddings against a 4000-update warmup"),
    docs="lab/record/no-warmup.md",
    takes="two calls on one H100 (their settings: lab/record/no-warmup.md)",
    summary="the arms of the 2026-11-26 evidence (d=512, lr 5e-4, no warmup, fp16, seed 1) with its settings",
    base=D512_BASE,
    arms=(
        Arm("w98", WARMUP_4000, note="Xavier, 4000-update warmup, beta2 .98"),
        Arm("x98", (), note="Xavier, no warmup, beta2 .98"),
        Arm("x999", BETAS_999, note="Xavier, no warmup, beta2 .999"),
        Arm("g98", GI_EVIDENCE, note="GradInit per_branch, beta2 .98"),
        Arm("g999", GI_EVIDENCE + BETAS_999, note="GradInit per_branch, beta2 .999 (same scales as g98)"),
        Arm("g98shared", _gi("--gradinit-adam-state", "shared"), note="GradInit, shared Adam moments"),
        Arm("g98tau1e-2", _gi("--gradinit-lr", "1e-2"), note="GradInit per_branch, tau 1e-2"),
    ),
    max_update=3000,
    calls=(
        StudyCall("A", ("w98", "x98", "x999"), ("g98", "g98shared", "g98tau1e-2"),
                  note="the Xavier/warmup arms train while the three GradInit configurations are computed"),
        StudyCall("B", ("g98", "g999", "g98shared", "g98tau1e-2"),
                  note="the GradInit arms from call A's scales (carry the cache)"),
    ),
    throughput="h100",
    doc="""\
Setup of lab/record/evidence/nowarmup-d512-2026-11-26/README.md: transformer_iwslt_de_en (d=512),
--share-all-embeddings, dropout 0.3, label smoothing 0.1, Adam lr 5e-4 constant, 4096-token
batches, fp16, seed 1, validation every 100 updates; GradInit 780 iterations, eta 5e-4, gamma 1e3,
tau 2.5e-3, 4096-token batches, per_branch moments, zero tensors outside the simulated step
(--gradinit-step-params scaled, the engine's behaviour then). g98 and g999 share one GradInit
group (the training betas do not enter GradInit). Data: scripts/prepare_corpus.py --vocab-size 6000.""",
)


# -- the screen of eight differences from the authors' setup -----------------------------------------------------------------------
AUTHORS_BOUNDS = recipe_args(AUTHORS_RECIPE, ("scale_bounds",))[1]
RECIPE_5 = ("--weight-decay", "1e-4", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
            "--lr-scheduler", "polynomial_decay", "--total-num-update", "100000", "--end-learning-rate", "0",
            "--warmup-updates", "0")
G98_SCALES = ("--gradinit-init-file", "{g98}")

SCREEN = Preset(
    name="screen",
    answers=("which of eight differences from the authors' setup keeps GradInit on the unigram plateau at d=512 "
             "without warmup"),
    docs="lab/record/no-warmup.md",
    takes="two calls of at most 7 minutes each on one H100 (planned, not run)",
    summary="differences 1-8 from the authors' setup, one arm each, plus warmup and Xavier "
            "references (d=512, one seed, 3000 updates, two GPU calls: --call A, then --call B)",
    base=D512_BASE,
    arms=(
        Arm("w98", WARMUP_4000, note="reference: Xavier with a 4000-update warmup"),
        Arm("x98", (), note="reference: Xavier, no warmup"),
        Arm("d1-sepdict", GI_EVIDENCE + ("--share-decoder-input-output-embed",), drop=("--share-all-embeddings",),
            data="separate", note="1: separate dictionaries, decoder input/output tied, encoder embeddings "
                                  "their own scale (needs --data-bin separate=PATH from prepare_corpus.py --separate-dicts)"),
        Arm("d2-authors", _gi("--gradinit-eta", "1e-3", "--gradinit-max-tokens", "6000"),
            note="2: the authors' launch settings (eta 1e-3, gamma 1e3, tau 2.5e-3, per_branch, 780 iterations, "
                 "6000-token batches, no clipping)"),
        Arm("d3-stepall", _gi("--gradinit-step-params", "all"),
            note="3: every trainable tensor (all-zero biases too) in g, ||g|| and the simulated step"),
        Arm("d4-bounds", GI_EVIDENCE + ("--gradinit-scale-bounds", AUTHORS_BOUNDS),
            note="4: per-group bounds: biases down to 0, LayerNorm weights capped at 100"),
        Arm("d5-recipe", G98_SCALES + RECIPE_5,
            note="5: weight decay 1e-4, attention/activation dropout 0.1, linear decay to 0 over 100k updates "
                 "(GradInit scales of the evidence's g98)"),
        Arm("d6-gamma3e3", _gi("--gradinit-gamma", "3e3"),
            note="6: gamma 3e3 (the init's ||g||_1 is 17,227): a shorter constraint phase, more objective steps"),
        Arm("d6-iters1560", _gi("--gradinit-iters", "1560"),
            note="6 (extra, not in calls A/B): twice the iterations; its GradInit phase alone is ~2x a 780-iteration one"),
        Arm("d8-window", G98_SCALES + ("--fp16-scale-window", "256", "--threshold-loss-scale", "0.03125"),
            note="8: Admin's fp16 flags, GradInit scales of the evidence's g98"),
        Arm("d8-fp32", G98_SCALES, drop=("--fp16",), note="8: fp32, GradInit scales of the evidence's g98"),
        Arm("x98-fp32", (), drop=("--fp16",), note="8: Xavier, no warmup, fp32 (the control of d8-fp32)"),
    ),
    max_update=3000,
    files={"g98": f"{EVIDENCE_DIR}/g98.gradinit.json"},
    calls=(
        StudyCall("A", ("d8-fp32", "x98-fp32", "d5-recipe", "d8-window"),
                  ("d1-sepdict", "d2-authors", "d3-stepall", "d4-bounds", "d6-gamma3e3"),
                  note="4 arms train (none needs new scales) while the 5 new GradInit configurations are computed"),
        StudyCall("B", ("d1-sepdict", "d2-authors", "d3-stepall", "d4-bounds", "d6-gamma3e3", "w98"),
                  note="5 arms from call A's cached scales (carry the cache folder) and the warmup reference"),
    ),
    throughput="h100",
    doc="""\
Base: the evidence's d=512 setting (see preset 'evidence'); each arm changes one thing against
the evidence's GradInit arm g98 (or is a reference). Difference 7 (the learned scales) is the
per-layer report of the computed gradinit.json files, not a training arm.

GPU plan (one H100, two calls of at most 7 minutes). From the evidence: six d=512 arms sharing
the GPU ran at ~7 updates/s each (about 42-60 updates/s in all), and a 780-iteration GradInit
phase cost ~265 s with six processes sharing it (about 2.4 updates' worth per iteration). With
2500-3000 updates per arm and a new GradInit phase for each of differences 1-4 and 6, the whole
screen is ~12-13 minutes of GPU work before start-up and BLEU, so the two calls are packed:
  call A: d8-fp32, x98-fp32, d5-recipe, d8-window train (their scales exist: the evidence's g98)
          while the five new GradInit phases (d1-d4, d6) run beside them and go to the cache;
  call B: d1-d4 and d6 train from the cached scales (nothing is computed first), beside w98.
The fp32 arms go first: they separate numerics from optimization most directly (the
evidence's logs make fp16 an unlikely cause of the plateau, lab/record/no-warmup.md; d8-fp32 tests it). The evidence's x98/w98 at these settings are the references (w98 is re-run
in call B as the in-study target). Each call: --parallel 9 (A) / 6 (B), --time-budget 5.25
minutes, --bleu-budget 0.75. Arms that do not reach 3000 updates are stopped by the budget (fp32
the likeliest); BLEU is taken at the largest checkpoint update (every 500) that all arms of the
call reached. x98 (fp16) and d6-iters1560 are in neither call; run them with --arms in a third call.
The exact commands are in lab/study.md.""",
)


# -- the CPU demonstration (was scripts/run_debian_demo.sh) ------------------------------------
D128_BASE = (
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "6", "--decoder-layers", "6",
    "--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
    "--decoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings", "--dropout", "0.3", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
    "--lr-scheduler", "fixed", "--max-tokens", "4096", "--num-workers", "0",
)
GI_DEMO = ("--gradinit-iters", "200", "--gradinit-max-tokens", "4096", "--gradinit-log-interval", "10",
           "--gradinit-adam-state", "shared") + _with(paper_defaults(1e-3), "--gradinit-lr", "1e-2")

DEMO = Preset(
    name="demo",
    answers=("whether GradInit lets a small (d=128) Post-LN Transformer train without warmup, against Xavier and a"
             " 200-update warmup"),
    docs="lab/record/debian-demo.md",
    summary="lab/record/debian-demo.md: 6+6-layer d=128 Post-LN Transformer, lr 1e-3, Xavier / GradInit "
            "without warmup vs a 200-update warmup, 600 updates (CPU: add --cpu)",
    duration="with --cpu, most of a day on a 2-core VM (a 1024-token update took ~7 s on one thread there, a "
             "GradInit constraint iteration ~19 s: lab/record/debian-demo.md); on one GPU, about 3 minutes per arm",
    base=D128_BASE,
    arms=(
        Arm("gradinit-s1", GI_DEMO + ("--seed", "1"), note="GradInit (the plugin's Adam defaults: eta = 2 x lr = 2e-3, "
                                                        "gamma = 1/eta = 500), seed 1"),
        Arm("xavier-s1", ("--seed", "1"), note="Xavier, no warmup, seed 1"),
        Arm("warmup-s1", ("--seed", "1", "--warmup-updates", "200"), note="Xavier, 200-update linear warmup, seed 1"),
        Arm("gradinit-s2", GI_DEMO + ("--seed", "2"), note="GradInit, seed 2"),
        Arm("xavier-s2", ("--seed", "2"), note="Xavier, no warmup, seed 2"),
    ),
    max_update=600,
    save_every=300,
    doc="""\
The former scripts/run_debian_demo.sh with its defaults (LR=1e-3, UPDATES=600, VALID_EVERY=100,
WARMUP=200, GI_ITERS=200, GI_LR=1e-2). Its knobs are now arguments: --max-update, --valid-every,
and --base-args for the rest (e.g. --base-args '--lr 2e-3 --gradinit-gamma 500
--gradinit-adam-state per_branch'; an arm's own arguments win over the base, so --warmup-updates
in the base does not reach warmup-s1). On the CPU add --cpu (and keep --parallel 1).""",
)

# -- the ablation of the authors' setup -----------------------------------------------
AUTHORS_EVIDENCE_DIR = "lab/record/evidence/nowarmup-d512-authors-2026-11-26"  # relative to the repository root
#: The authors' GradInit launch settings as the recorded runs of presets ablate, confirm, hold and shock
#: passed them (the evidence's authors.gradinit.json), spelled out so that they do not depend on the
#: plugin's defaults: the recipe's values (:data:`AUTHORS_RECIPE`) in the order the runs gave them, less
#: :data:`GI_AUTHORS_LEFT_OUT`, and the single simulated step pinned.
GI_AUTHORS = recipe_args(AUTHORS_RECIPE, (
    "iters", "eta", "gamma", "lr", "max_tokens", "adam_state", "step_params", "scale_bounds",
)) + ("--gradinit-tied-embeddings", "shared") + PAPER_STEP
#: The recipe's values that :data:`GI_AUTHORS` leaves out, and why: ``field -> reason``.
GI_AUTHORS_LEFT_OUT = {
    "optimizer": "the plugin derives adam from the runs' --optimizer adam",
    "betas": "the plugin's default (0.9, 0.98) is the recipe's",
    "min_scale": "the plugin's default 0.01 is the recipe's",
    "overlap": "the plugin's default 0.5 is the recipe's",
    "unstepped_uses": "the recorded runs stepped every use of the tied output projection; adding it would change "
                      "their scales and the cache keys of their GradInit groups (the arms gi-unstepped-out of "
                      "hold and gi-unstepped of shock add it: the recipe's whole setting)",
}
#: Separate dictionaries, decoder input embeddings tied to the output projection (the authors' data setup).
SEPARATE = ("--share-decoder-input-output-embed",)
SEPARATE_DROP = ("--share-all-embeddings",)
AUTHORS_SCALES = ("--gradinit-init-file", "{authors}")


def _gi_authors(*overrides: str, drop: Tuple[str, ...] = ()) -> Tuple[str, ...]:
    """The authors' GradInit arguments with some replaced (``drop``: options removed)."""
    from .arms import merge_args

    return tuple(merge_args(GI_AUTHORS, overrides, drop))


ABLATE = Preset(
    name="ablate",
    answers=("which of the authors' settings make their GradInit setup learn without warmup at d=512 (one leave-"
             "one-out arm each, 600 updates)"),
    docs="lab/record/no-warmup.md",
    takes="on one H100 about 6 minutes (call A) and 3 minutes (call B), estimated, not run",
    summary="the authors' whole setup ('authors') and one leave-one-out arm per setting "
            "(d=512, lr 5e-4 without warmup, fp16, seed 1, 600 updates, two GPU calls: --call A, then --call B)",
    base=D512_BASE,
    arms=(
        Arm("authors", AUTHORS_SCALES + SEPARATE + RECIPE_5, drop=SEPARATE_DROP, data="separate",
            note="the evidence's authors arm: separate dictionaries, its learned scales re-applied "
                 "(authors.gradinit.json), the authors' training recipe"),
        Arm("shared-emb", GI_AUTHORS + RECIPE_5,
            note="joint dictionary, --share-all-embeddings: one scale for encoder input, decoder input and "
                 "output projection"),
        Arm("per-use", _gi_authors("--gradinit-tied-embeddings", "per-use") + RECIPE_5,
            note="joint dictionary, --share-all-embeddings, one GradInit scale per use of the tied embeddings"),
        Arm("eta-lr", _gi_authors("--gradinit-eta", "5e-4") + SEPARATE + RECIPE_5, drop=SEPARATE_DROP,
            data="separate", note="eta = lr (5e-4, the paper's text) instead of the launch script's 1e-3"),
        Arm("tok4096", _gi_authors("--gradinit-max-tokens", "4096") + SEPARATE + RECIPE_5, drop=SEPARATE_DROP,
            data="separate", note="4096-token GradInit batches (S ~2730 tokens) instead of 6000"),
        Arm("no-bounds", _gi_authors(drop=("--gradinit-scale-bounds",)) + SEPARATE + RECIPE_5,
            drop=SEPARATE_DROP, data="separate",
            note="no group bounds: biases keep the global minimum 0.01, LayerNorm weights uncapped"),
        Arm("shared-moments", _gi_authors("--gradinit-adam-state", "shared") + SEPARATE + RECIPE_5,
            drop=SEPARATE_DROP, data="separate",
            note="one set of Adam moments for constraint and objective iterations"),
        Arm("no-recipe", AUTHORS_SCALES + SEPARATE, drop=SEPARATE_DROP, data="separate",
            note="the authors' scales, but constant lr, no weight decay, no attention/activation dropout "
                 "(GradInit runs in eval mode and does not see these)"),
        Arm("confirm-s2", _gi_authors("--seed", "2") + SEPARATE + RECIPE_5, drop=SEPARATE_DROP, data="separate",
            note="not trained here: the seed-2 scales of preset 'confirm', cached in call A"),
    ),
    max_update=600,
    save_every=300,
    files={"authors": f"{AUTHORS_EVIDENCE_DIR}/authors.gradinit.json"},
    calls=(
        StudyCall("A", ("authors", "no-recipe"),
                  ("shared-emb", "per-use", "eta-lr", "tok4096", "no-bounds", "shared-moments", "confirm-s2"),
                  note="the two arms whose scales exist train while the seven GradInit phases are computed"),
        StudyCall("B", ("shared-emb", "per-use", "eta-lr", "tok4096", "no-bounds", "shared-moments"),
                  note="the six leave-one-out arms from call A's cached scales (carry the cache folder)"),
    ),
    throughput="h100",
    doc="""\
Base: the evidence's d=512 setting (preset 'evidence'); 'authors' is the README's IWSLT recipe as
measured in lab/record/evidence/nowarmup-d512-authors-2026-11-26 (learns from update 100; 8.94 at
update 300 against 9.74 on the plateau). Every other arm changes one setting of it; GradInit
settings are spelled out, so the arms do not depend on the plugin's defaults. 600 updates are
enough to tell learning from the plateau. Needs --data-bin separate=PATH (prepare_corpus.py
--separate-dicts). GPU plan: call A trains 'authors' and 'no-recipe' (the evidence's scales) while
the seven GradInit phases run (six leave-one-out arms and the seed-2 scales of preset 'confirm');
call B trains the six leave-one-out arms from the cache. From the evidence (five processes on one
H100: a 780-iteration phase 262-291 s, arms 3.3-5.7 updates/s), call A is ~6 minutes with seven
phases at once (an estimate: more processes share the GPU than in the evidence) and call B ~3 minutes.""",
)


# -- the confirmation at paper size -----------------------------------------------------
CONFIRM_BASE_DROP = ("--share-all-embeddings",)
#: The plain usage line: fairseq's own flags plus the iteration count.
#: The README's plain usage line as these d=512 presets ran it (the plugin's defaults of the time, at lr 5e-4).
GI_PLAIN = ("--gradinit-iters", "780") + paper_defaults(5e-4)
CONFIRM_RECIPE = SEPARATE + RECIPE_5
WARMUP_RECIPE = SEPARATE + ("--weight-decay", "1e-4", "--attention-dropout", "0.1", "--activation-dropout", "0.1") \
    + WARMUP_4000
#: The paper's SGD setting for IWSLT'14 (Sec. 4.2 and its appendix): momentum 0.9, lr 0.15, GradInit eta 0.15, gamma 1.
SGD_RECIPE = ("--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.15")


def _confirm_arm(name: str, args: Tuple[str, ...], note: str) -> Arm:
    # An arm that changes the optimizer (SGD) drops the base's Adam-only flag, which sgd does not accept.
    drop = CONFIRM_BASE_DROP + (("--adam-betas",) if "--optimizer" in args else ())
    return Arm(name, args, drop=drop, data="separate", note=note)


CONFIRM = Preset(
    name="confirm",
    answers=("whether GradInit without warmup matches a 4000-update warmup over 3000 updates at d=512, with two "
             "seeds, beta2 .999, SGD and BLEU"),
    docs="lab/record/no-warmup.md",
    takes=("on one H100 9-15 minutes for call A (more than one 7-minute call: give --time-budget or split it), "
           "less for call B; estimated, not run"),
    summary="GradInit without warmup (beta2 .98 and .999) against a 4000-update warmup in the same "
            "setup and Xavier, seeds 1 and 2, plus SGD, 3000 updates, BLEU at 3000 (d=512, fp16)",
    base=D512_BASE,
    arms=(
        _confirm_arm("gi98-s1", AUTHORS_SCALES + CONFIRM_RECIPE,
                     "GradInit (the authors' settings: the evidence's scales), no warmup, beta2 .98, seed 1"),
        _confirm_arm("gi98-s2", _gi_authors("--seed", "2") + CONFIRM_RECIPE,
                     "the same, seed 2 (its scales computed with the authors' settings, as seed 1's)"),
        _confirm_arm("gi999-s1", AUTHORS_SCALES + CONFIRM_RECIPE + BETAS_999,
                     "GradInit, no warmup, beta2 .999 (the scales of gi98-s1: betas do not enter GradInit)"),
        _confirm_arm("gi999-s2", _gi_authors("--seed", "2") + CONFIRM_RECIPE + BETAS_999, "the same, seed 2"),
        _confirm_arm("warm-s1", WARMUP_RECIPE, "Xavier, inverse_sqrt with 4000 warmup updates from 1e-7, seed 1"),
        _confirm_arm("warm-s2", WARMUP_RECIPE + ("--seed", "2"), "the same, seed 2"),
        _confirm_arm("x98-s1", CONFIRM_RECIPE, "Xavier, no warmup, beta2 .98, seed 1 (the control)"),
        _confirm_arm("gisgd-s1", ("--gradinit-iters", "780", "--gradinit-lr", "2.5e-3") + CONFIRM_RECIPE + SGD_RECIPE,
                     "SGD momentum 0.9, lr 0.15, no warmup, GradInit from the plain usage line "
                     "(its SGD defaults: eta = lr = 0.15, gamma 1, as the paper)"),
        _confirm_arm("xsgd-s1", CONFIRM_RECIPE + SGD_RECIPE, "SGD momentum 0.9, lr 0.15, no warmup, Xavier"),
    ),
    max_update=3000,
    save_every=1000,
    files={"authors": f"{AUTHORS_EVIDENCE_DIR}/authors.gradinit.json"},
    calls=(
        StudyCall("A", ("gi98-s1", "gi98-s2", "gi999-s1", "gi999-s2", "warm-s1", "x98-s1"),
                  note="the Adam arms; seed 2's GradInit group must be in the cache (preset ablate's call A "
                       "computes it as its arm confirm-s2; else this call computes it first)"),
        StudyCall("B", ("warm-s2", "gisgd-s1", "xsgd-s1"),
                  note="the seed-2 warmup reference and the SGD pair (computes the SGD GradInit phase)"),
    ),
    throughput="h100",
    doc="""\
The authors' setup on the separate-dictionary data-bin: --share-decoder-input-output-embed, weight
decay 1e-4, attention/activation dropout 0.1; the no-warmup arms decay the lr linearly to 0 over
100k updates (polynomial_decay), the warmup arms use fairseq's IWSLT recipe (inverse_sqrt, 4000
warmup updates from 1e-7). The Adam GradInit arms use the authors' settings spelled out: seed 1
re-applies the evidence's scales (authors.gradinit.json), seed 2 computes its own with the same
settings (cached by preset ablate's call A). The plugin's defaults equal these settings except
that the GradInit batch is (2 - overlap) x --max-tokens = 6144 tokens instead of 6000; the SGD arm
uses the plain usage line. 3000 updates (about 20 epochs of the Debian corpus), validation every
100, BLEU at update 3000 on the test split. Needs --data-bin separate=PATH. From the evidence
(arms 3.3-5.7 updates/s with five processes on one H100) call A's six arms of 3000 updates take
9-15 minutes, more than one 7-minute call: run it with --time-budget and report how far each arm
got, or split its arms over two calls with --arms.""",
)


# -- Admin's comparison with the Admin authors' recipe -------------------------------
WSKIP_ARCH = ("--arch", "transformer_wskip_iwslt_de_en")
#: The Admin authors' no-warmup recipe: RAdam, lr decayed linearly (warmup 1), weight decay 1e-4, attention
#: and activation dropout 0.1, their fp16 loss-scale flags; omega profiled once with seed 1111.
ADMIN_RECIPE = (
    "--optimizer", "radam", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "1",
    "--total-num-update", "100000", "--end-learning-rate", "0", "--weight-decay", "1e-4",
    "--attention-dropout", "0.1", "--activation-dropout", "0.1",
    "--fp16-scale-window", "256", "--threshold-loss-scale", "0.03125",
)
ADMIN_INIT = ("--wskip-init", "admin", "--wskip-profile-seed", "1111")

WSKIP = Preset(
    name="wskip",
    answers=("how Admin's w_skip Transformer with the Admin authors' no-warmup recipe compares with GradInit on "
             "the same model and recipe"),
    docs="docs/wskip.md",
    takes="one call on one H100 that stops itself within 9 minutes",
    summary="Admin's w_skip Transformer with the Admin authors' recipe (RAdam, linear decay, "
            "omega profiled with seed 1111) against GradInit on the same model and recipe, no warmup "
            "(d=512, fp16, 2500 updates, one GPU call)",
    base=D512_BASE,
    arms=(
        Arm("admin-s1", WSKIP_ARCH + ADMIN_INIT + ADMIN_RECIPE, note="w_skip, Admin init (seed-1111 profile), seed 1"),
        Arm("admin-s2", WSKIP_ARCH + ADMIN_INIT + ADMIN_RECIPE + ("--seed", "2"), note="the same, seed 2"),
        Arm("admin999-s1", WSKIP_ARCH + ADMIN_INIT + ADMIN_RECIPE + BETAS_999, note="w_skip, Admin init, beta2 .999"),
        Arm("giw-s1", WSKIP_ARCH + GI_PLAIN + ADMIN_RECIPE,
            note="w_skip with omega = 1, GradInit from the plain usage line (its defaults), same recipe"),
        Arm("giw999-s1", WSKIP_ARCH + GI_PLAIN + ADMIN_RECIPE + BETAS_999,
            note="the same GradInit scales, beta2 .999 (the betas do not enter GradInit)"),
        Arm("xw-s1", WSKIP_ARCH + ADMIN_RECIPE, note="w_skip with omega = 1, Xavier, same recipe (the control)"),
    ),
    max_update=2500,
    calls=(StudyCall("A", ("admin-s1", "admin-s2", "admin999-s1", "giw-s1", "giw999-s1", "xw-s1"),
                     note="one GradInit phase (giw-s1 and giw999-s1 share it); the four other arms train meanwhile"),),
    throughput="h100",
    doc="""\
Base: the evidence's d=512 setting (preset 'evidence': --share-all-embeddings, dropout 0.3,
label smoothing 0.1, lr 5e-4, 4096-token batches, fp16, seed 1). Every arm is Admin's
transformer_wskip_iwslt_de_en trained with the Admin authors' no-warmup recipe: --optimizer radam
(torch's RAdam; theirs skips the update while the variance rectification is undefined, torch's takes
an unrectified momentum step, see docs/wskip.md), lr decayed linearly to 0 from update 1
(polynomial_decay, warmup 1), weight decay 1e-4, attention/activation dropout 0.1,
--fp16-scale-window 256 --threshold-loss-scale 0.03125. Admin arms profile omega on a twin model of
seed 1111 (--wskip-profile-seed), as the Admin authors profile once and reuse omega across seeds;
the GradInit arms start from omega = 1 and learn a scale for every tensor, omega included. One call
on one H100: six arms, one 780-iteration GradInit phase (--time-budget 7 --bleu-budget 0.75).""",
)


# -- what keeps a no-warmup run alive past the collapse ------------------------
HOLD_EVIDENCE_DIR = "lab/record/evidence/nowarmup-d512-hold-2026-11-27"  # relative to the repository root
#: The training monitor, one record every validation interval.
MONITOR = ("--gradinit-monitor-interval", "100")
#: The Admin authors' fp16 loss-scale flags: the scale grows back after 256 clean updates and never
#: falls below 2^-5.
ADMIN_LOSS_SCALE = ("--fp16-scale-window", "256", "--threshold-loss-scale", "0.03125")
CLAMP_STRONG = "[('norm', 0.3, None), ('re:.', 0.1, None)]"
CLAMP_MILD = "[('norm', 0.1, None), ('re:.', 0.05, None)]"
HIGHER_FLOOR = "[('bias', 0, None), ('norm', 0.3, 100), ('re:.', 0.1, None)]"
#: The authors' simulated step: the tied output projection keeps its un-stepped weights.
UNSTEPPED_OUTPUT = AUTHORS_RECIPE.values["unstepped_uses"]
HOLD_SCALES = AUTHORS_SCALES + CONFIRM_RECIPE + MONITOR


def _hold_arm(name: str, args: Tuple[str, ...], note: str, drop: Tuple[str, ...] = ()) -> Arm:
    return Arm(name, args, drop=CONFIRM_BASE_DROP + drop, data="separate", note=note)


HOLD = Preset(
    name="hold",
    answers=("whether fp32, Admin's loss-scale flags, clamped scales or other GradInit settings keep the authors' "
             "no-warmup run alive to 3000 updates (call A ran: none did)"),
    docs="lab/record/no-warmup.md",
    summary="what keeps the authors' no-warmup run alive past update 2300-2700 (where it collapsed): "
            "their scales in fp16, fp32, with Admin's loss-scale flags and clamped at two levels, 3000 updates "
            "each in one call of at most 8 minutes on one H200 (call A); new GradInit phases and the warmup "
            "reference in call B, their arms in call C",
    base=D512_BASE,
    arms=(
        _hold_arm("ctl-fp16", HOLD_SCALES, "control: the evidence's scales (authors.gradinit.json), the authors' "
                                           "recipe, fp16 (the evidence's gi98-s1, which collapsed at 2300-2700)"),
        _hold_arm("fp32", HOLD_SCALES, "the same in fp32", drop=("--fp16",)),
        _hold_arm("admin-ls", HOLD_SCALES + ADMIN_LOSS_SCALE,
                  "the same, fp16 with the Admin authors' loss-scale flags (window 256, threshold 2^-5)"),
        _hold_arm("clamp-strong", HOLD_SCALES + ("--gradinit-init-clamp", CLAMP_STRONG),
                  "the same scales clamped: LayerNorm weights >= 0.3, every other tensor >= 0.1"),
        _hold_arm("clamp-mild", HOLD_SCALES + ("--gradinit-init-clamp", CLAMP_MILD),
                  "the same scales clamped: LayerNorm weights >= 0.1, every other tensor >= 0.05"),
        _hold_arm("gi-eta5e-4", _gi_authors("--gradinit-eta", "5e-4") + CONFIRM_RECIPE + MONITOR,
                  "GradInit with the authors' settings but eta 5e-4 (the paper's text: eta = lr)"),
        _hold_arm("gi-floor", _gi_authors("--gradinit-scale-bounds", HIGHER_FLOOR) + CONFIRM_RECIPE + MONITOR,
                  "GradInit with a higher floor: LayerNorm weights in [0.3, 100], weights >= 0.1, biases >= 0"),
        _hold_arm("gi-unstepped-out", _gi_authors("--gradinit-unstepped-uses", UNSTEPPED_OUTPUT)
                  + CONFIRM_RECIPE + MONITOR,
                  "GradInit with the authors' simulated step: the tied output projection keeps its un-stepped "
                  "weights"),
        _hold_arm("plain-s2", GI_PLAIN + ("--seed", "2") + CONFIRM_RECIPE + MONITOR,
                  "the README's plain usage line (plugin defaults, --gradinit-iters 780) at seed 2, which blew up "
                  "in the evidence"),
        _hold_arm("gi-ratio", _gi_authors("--gradinit-max-step-ratio", "0.5") + CONFIRM_RECIPE + MONITOR,
                  "GradInit whose simulated sign step moves no tensor by more than half its root-mean-square "
                  "(scale floors eta / (0.5 rms W), about 0.05-0.06 for the d=512 weights)"),
        _hold_arm("gi-dropout", _gi_authors("--gradinit-dropout", "true") + CONFIRM_RECIPE + MONITOR,
                  "GradInit in train mode (dropout on during the phase)"),
        _hold_arm("warm-s1", WARMUP_RECIPE + MONITOR,
                  "reference: Xavier, inverse_sqrt with 4000 warmup updates (the evidence's warm-s1, monitor on)"),
    ),
    max_update=3000,
    save_every=500,
    files={"authors": f"{AUTHORS_EVIDENCE_DIR}/authors.gradinit.json"},
    calls=(
        StudyCall("A", ("ctl-fp16", "fp32", "admin-ls", "clamp-strong", "clamp-mild"),
                  note="the five arms whose scales exist, 3000 updates each; no GradInit phase fits beside them",
                  parallel=5, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("B", ("warm-s1",), ("gi-eta5e-4", "gi-floor", "gi-unstepped-out", "plain-s2"),
                  note="the four GradInit phases into the cache (exported in the archive) beside the warmup "
                       "reference",
                  parallel=5, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("C", ("gi-eta5e-4", "gi-floor", "gi-unstepped-out", "plain-s2"),
                  note="the four GradInit arms from call B's cache (--gradinit-cache: the archive's gradinit/)",
                  parallel=4, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("D", (), ("gi-ratio", "gi-dropout"),
                  note="two more GradInit phases into the cache: the step-ratio floor and dropout during GradInit "
                       "(phase and training of both do not fit one call)",
                  parallel=2, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("E", ("gi-ratio", "gi-dropout"),
                  note="their two arms from call D's cache (--gradinit-cache: the archive's gradinit/)",
                  parallel=2, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
    ),
    throughput="h200",
    doc="""\
The authors' recipe of preset 'confirm' (separate dictionaries, --share-decoder-input-output-embed,
weight decay 1e-4, attention/activation dropout 0.1, linear decay, no warmup), seed 1, d=512, fp16,
the training monitor on (--gradinit-monitor-interval 100: monitor.jsonl per arm), 3000 updates,
checkpoints every 500, BLEU at the largest checkpoint all arms reached. Needs --data-bin
separate=PATH (prepare_corpus.py --separate-dicts); every arm trains on it.
Timing (study.estimate, printed by --dry-run and --list-presets): five arms at once run ~8
updates/s each on one H200, so 3000 updates take ~375 s plus start-up. A GradInit phase beside
them slows all five below what 3000 updates need within the call (a phase weighs more than an
arm), so call A trains only the five arms and the BLEU step is short (30 s, its measured decode
rate is recorded); the GradInit phases run in call B beside the warmup reference, and call C
trains their arms from the cache. Calls D and E do the same for two more remedies (the step-ratio
floor, dropout during GradInit): two phases then, from the cache, two arms. Each call packs what
it exports into one archive (--archive).""",
)


# -- the decoder's delayed no-warmup shock and the eval-mode breakdown ----------------------------
HOLDA_EVIDENCE_DIR = "lab/record/evidence/nowarmup-d512-holdA-2026-11-27"  # relative to the repository root
#: cuDNN's fused attention off: on torch 2.11 with sm90 its backward returns NaN query gradients for
#: sequence lengths of 64 mod 128 with a mask (every fp16 overflow of the holdA evidence after start-up).
CUDNN_GUARD = ("--gradinit-cudnn-sdpa-guard", "on")
NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0")
#: polynomial_decay's warmup: the lr rises linearly from 0 to 5e-4 over 500 updates, then decays as before.
WARMUP_500 = ("--warmup-updates", "500")
#: gamma = K x the init's gradient norm: with K = 2 the first iteration is an objective step and the
#: constraint binds only where the norm has doubled (the holdA evidence: ||g||_1 18,283 at iteration 1
#: against gamma 1e3, 556 of 780 iterations constraint steps).
GAMMA_INIT_FACTOR = ("--gradinit-gamma-init-factor", "2")
#: The authors' S and S-tilde: the first and last two thirds of one unshuffled batch.
AUTHORS_PAIRS = ("--gradinit-pairs", "authors")
SHOCK_TRAIN = CONFIRM_RECIPE + MONITOR + CUDNN_GUARD
SHOCK_SCALES = AUTHORS_SCALES + SHOCK_TRAIN


def _shock_arm(name: str, args: Tuple[str, ...], note: str) -> Arm:
    return Arm(name, args, drop=CONFIRM_BASE_DROP, data="separate", note=note)


SHOCK = Preset(
    name="shock",
    answers=("why no-warmup training breaks down in eval mode after ~2000 updates once the cuDNN attention bug is "
             "guarded: dropout, the lower decoder's un-warmed Adam shock, or how GradInit learned its scales"),
    docs="lab/record/no-warmup.md",
    summary="why no-warmup training breaks after ~2000 updates once the cuDNN attention bug is guarded: "
            "dropout, a short warmup after GradInit, and GradInit with a rarely binding gamma, the authors' "
            "simulated step or their S/S-tilde (d=512, 3000 updates, calls of at most 8 minutes on one H200)",
    base=D512_BASE,
    arms=(
        _shock_arm("ctl", SHOCK_SCALES, "control: the evidence's scales (authors.gradinit.json), the authors' "
                                        "recipe, fp16, cuDNN attention guarded"),
        _shock_arm("nodrop", _with(SHOCK_SCALES, *NO_DROPOUT), "the same without dropout, attention or activation "
                                                               "dropout"),
        _shock_arm("attdrop0", _with(SHOCK_SCALES, "--attention-dropout", "0"), "the same, attention dropout 0 only"),
        _shock_arm("gi-warm500", _with(SHOCK_SCALES, *WARMUP_500), "the same scales, then 500 warmup updates"),
        _shock_arm("warm-s1", WARMUP_RECIPE + MONITOR + CUDNN_GUARD,
                   "reference: Xavier, inverse_sqrt with 4000 warmup updates (monitor on: the healthy values)"),
        _shock_arm("x-warm500", _with(SHOCK_TRAIN, *WARMUP_500), "Xavier with the same 500 warmup updates "
                                                                 "(the comparator of gi-warm500)"),
        _shock_arm("gi-gamma", _gi_authors(*GAMMA_INIT_FACTOR, drop=("--gradinit-gamma",)) + SHOCK_TRAIN,
                   "GradInit with the authors' settings but gamma = 2 x the init's gradient norm (rarely binds)"),
        _shock_arm("gi-unstepped", _gi_authors("--gradinit-unstepped-uses", UNSTEPPED_OUTPUT) + SHOCK_TRAIN,
                   "GradInit with the authors' simulated step: the tied output projection un-stepped"),
        _shock_arm("gi-pairs", GI_AUTHORS + AUTHORS_PAIRS + SHOCK_TRAIN,
                   "GradInit with the authors' S and S-tilde (two thirds of one unshuffled batch each)"),
        _shock_arm("gi-look4", ("--gradinit-iters", "200", "--gradinit-lr", "1e-2") + GAMMA_INIT_FACTOR
                   + ("--gradinit-lookahead-steps", "4") + SHOCK_TRAIN,
                   "the CPU testbed's gi-look4 at d=512: 200 iterations at tau 1e-2, gamma = 2 x the init's "
                   "gradient norm, the loss after 4 simulated Adam steps (plugin defaults otherwise)"),
    ),
    max_update=3000,
    save_every=500,
    files={"authors": f"{AUTHORS_EVIDENCE_DIR}/authors.gradinit.json"},
    recompute={"authors": GI_AUTHORS},
    calls=(
        # The same shape as hold's call A, whose arms needed its whole 7-minute budget (about a minute to
        # start, ~350 s to train): 30 s more for training, from a BLEU step too short to decode anyway.
        StudyCall("A", ("ctl", "nodrop", "attdrop0", "gi-warm500", "warm-s1"),
                  note="the five arms that need no GradInit phase",
                  parallel=5, time_budget=7.5, bleu_budget=0.25, finish_margin=20.0, limit_s=480.0),
        StudyCall("B", ("x-warm500",), ("gi-gamma", "gi-unstepped", "gi-pairs"),
                  note="the three GradInit phases into the cache (exported in the archive) beside x-warm500",
                  parallel=4, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("C", ("gi-gamma", "gi-unstepped", "gi-pairs"),
                  note="the three GradInit arms from call B's cache (--gradinit-cache: the archive's gradinit/)",
                  parallel=3, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("E", ("gi-look4",),
                  note="the CPU testbed's variant at d=512: its GradInit phase, then its arm (the references are "
                       "call A's warm-s1 and ctl; call D --arms gi-look4 repeats it at seed 2)",
                  parallel=1, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
        StudyCall("D", (), repeat_seed=2,
                  note="a second seed of the arms named with --arms (trained) or --prepare-arms (GradInit "
                       "scales computed into the cache, for a later --call D --arms)",
                  parallel=5, time_budget=7.0, bleu_budget=0.5, finish_margin=20.0, limit_s=480.0),
    ),
    throughput="h200",
    doc="""\
The recipe of preset 'hold' (separate dictionaries, weight decay 1e-4, attention/activation dropout
0.1, linear decay, no warmup, seed 1, fp16), the training monitor every 100 updates and cuDNN's
fused attention off in every arm (--gradinit-cudnn-sdpa-guard on). Needs --data-bin separate=PATH.
Commands, predictions and estimates: lab/record/no-warmup.md.""",
)


# -- the d=128 CPU testbed of the no-warmup failure ---------------------------------------------
#: The README's quick-start model at the testbed's calibrated learning rate (1e-3: a 200-update warmup
#: learns, Xavier without warmup stays on the unigram plateau; lab/record/testbed-d128.md), 2048-token
#: batches, the monitor and the dropout-on validation loss in every arm.
TESTBED_BASE = _with(D128_BASE, "--max-tokens", "2048", "--seed", "1") + MONITOR + ("--gradinit-valid-dropout-loss",)
#: A short screening phase: the plain usage line's settings with 200 iterations at tau 1e-2 (the
#: 780-iteration phase at the default tau takes ~20 minutes on one core).
TB_SCREEN = ("--gradinit-iters", "200", "--gradinit-lr", "1e-2")
#: The plain usage line's GradInit at the testbed's lr as batch 1 ran it (the plugin's defaults of the time:
#: gamma = 1/eta = 500, tau 2.5e-3, one simulated step); the screening phase replaces tau by 1e-2.
TB_PAPER = paper_defaults(1e-3)
TB_PAPER_SCREEN = _with(TB_PAPER, *TB_SCREEN)
TB_WARMUP = ("--warmup-updates", "200")
#: The objective after four simulated Adam steps instead of one (--gradinit-lookahead-steps).
LOOKAHEAD_4 = ("--gradinit-lookahead-steps", "4")


#: GradInit's objective rewards source use: L + 1 x (L - L_rolled) on S~ (--gradinit-source-contrast).
SOURCE_CONTRAST = ("--gradinit-source-contrast", "1")
#: The source path kept at its initialization (scale 1): every encoder tensor (and so the shared embedding,
#: named by the encoder) and the decoder's cross-attention; the authors' other bounds as before.
SOURCE_PATH_PINNED = ("[('re:^encoder\\.', 1, 1), ('re:encoder_attn', 1, 1), ('bias', 0, None), "
                      "('norm', None, 100)]")


#: The contrast at the weight whose seed-1 run came nearest (batch 9).
CONTRAST_10 = ("--gradinit-source-contrast", "10")
#: L(S) at the learned scales at most 0.35 nats (half a bit) per token above its value at the init.
LOSS_CEILING = ("--gradinit-loss-ceiling", "0.35")


def _tb(name: str, args: Tuple[str, ...], note: str, drop: Tuple[str, ...] = ()) -> Arm:
    return Arm(name, args, drop=drop, note=note)


TESTBED = Preset(
    name="testbed",
    answers=("on the CPU in minutes: which explanation of the no-warmup failure holds at d=128, and whether a "
             "GradInit configuration trains the Post-LN Transformer without warmup as well as a 200-update warmup"),
    docs="lab/record/testbed-d128.md",
    summary="the README's quick-start model (6+6 layers, d=128) at lr 1e-3 without warmup on the CPU: Xavier, "
            "a 200-update warmup, GradInit (the plain usage line and a short screening phase), the explanations "
            "and our variants; eval-mode and dropout-on validation loss every 100 updates, 800 updates "
            "(add --cpu --no-bleu)",
    base=TESTBED_BASE,
    arms=(
        _tb("xavier", (), "Xavier, no warmup (the failure: the unigram plateau)"),
        _tb("warmup", TB_WARMUP, "Xavier, 200-update linear warmup (the target)"),
        _tb("gi", ("--gradinit-iters", "780") + TB_PAPER,
            "GradInit from the plain usage line (--gradinit-iters 780) with the paper's defaults, no warmup"),
        _tb("gi-screen", TB_PAPER_SCREEN, "GradInit, 200 iterations at tau 1e-2 (the screening phase), no warmup"),
        _tb("nodrop", NO_DROPOUT, "Xavier without dropout, no warmup"),
        _tb("nodrop-warmup", NO_DROPOUT + TB_WARMUP, "Xavier without dropout, 200-update warmup"),
        _tb("xavier-s2", ("--seed", "2"), "Xavier, no warmup, seed 2"),
        _tb("warmup-s2", TB_WARMUP + ("--seed", "2"), "200-update warmup, seed 2"),
        _tb("gi-pairs", TB_PAPER_SCREEN + AUTHORS_PAIRS, "the screening phase with the authors' S and S-tilde"),
        _tb("gi-unstepped", TB_PAPER_SCREEN + ("--gradinit-unstepped-uses", UNSTEPPED_OUTPUT),
            "the screening phase with the tied output projection un-stepped (the authors' simulated step)"),
        _tb("gi-eta-lr", _with(TB_PAPER_SCREEN, "--gradinit-eta", "1e-3", "--gradinit-gamma", "1000"), "the screening phase with eta = lr, not 2 x lr"),
        _tb("gi-warm50", ("--gradinit-iters", "780") + TB_PAPER + ("--warmup-updates", "50"), "GradInit (plain usage line), then 50 warmup updates"),
        _tb("xavier-warm50", ("--warmup-updates", "50"), "Xavier with the same 50 warmup updates"),
        _tb("xavier-warm50-s2", ("--warmup-updates", "50", "--seed", "2"), "xavier-warm50 at seed 2"),
        _tb("admin", WSKIP_ARCH + ADMIN_INIT, "Admin's w_skip Transformer with Admin's initialization, Adam, no "
                                             "warmup"),
        _tb("admin-s2", WSKIP_ARCH + ADMIN_INIT + ("--seed", "2"), "admin at seed 2"),
        _tb("radam", ("--optimizer", "radam"), "Xavier, RAdam (betas 0.9, 0.98), no warmup"),
        _tb("gi-dropout", TB_PAPER_SCREEN + ("--gradinit-dropout", "true"), "variant: the screening phase with dropout on"),
        _tb("gi-ratio", TB_PAPER_SCREEN + ("--gradinit-max-step-ratio", "0.5"),
            "variant: the screening phase; no simulated step moves a tensor by more than half its size"),
        _tb("gi-floors", TB_PAPER_SCREEN + ("--gradinit-scale-bounds", HIGHER_FLOOR),
            "variant: the screening phase with floors (weights >= 0.1, LayerNorm weights >= 0.3)"),
        _tb("gi-K2", TB_SCREEN + GAMMA_INIT_FACTOR + PAPER_STEP, "variant: the screening phase with gamma = 2 x the init's norm"),
        _tb("gi-K2-s2", TB_SCREEN + GAMMA_INIT_FACTOR + PAPER_STEP + ("--seed", "2"), "gi-K2 at seed 2"),
        _tb("gi-look4", TB_SCREEN + GAMMA_INIT_FACTOR + LOOKAHEAD_4,
            "variant: the screening phase, gamma = 2 x the init's norm, the loss after 4 simulated Adam steps"),
        _tb("gi-look4-s2", TB_SCREEN + GAMMA_INIT_FACTOR + LOOKAHEAD_4 + ("--seed", "2"), "gi-look4 at seed 2"),
        _tb("gi-look4-g", _with(TB_PAPER_SCREEN, *LOOKAHEAD_4),
            "variant: the screening phase (gamma of the plain usage line), the loss after 4 simulated Adam steps"),
        _tb("gi-default", ("--gradinit-iters", "200"),
            "the plain usage line with the plugin's defaults since the testbed (gi-look4's settings), 200 iterations"),
        _tb("gi-default-780", ("--gradinit-iters", "780"),
            "the plain usage line with the plugin's defaults, the paper's 780 iterations"),
        _tb("gi-look4-floors", TB_SCREEN + GAMMA_INIT_FACTOR + LOOKAHEAD_4 + ("--gradinit-scale-bounds", HIGHER_FLOOR),
            "variant: gi-look4 with gi-floors' floors, so that no block can be silenced"),
        _tb("gi-look4-floors-s2",
            TB_SCREEN + GAMMA_INIT_FACTOR + LOOKAHEAD_4 + ("--gradinit-scale-bounds", HIGHER_FLOOR, "--seed", "2"),
            "gi-look4-floors at seed 2"),
        _tb("gi-default-780-s2", ("--gradinit-iters", "780", "--seed", "2"), "gi-default-780 at seed 2"),
        _tb("gi-default-s2", ("--gradinit-iters", "200", "--seed", "2"), "gi-default at seed 2"),
        _tb("gi-contrast", ("--gradinit-iters", "200") + SOURCE_CONTRAST,
            "variant: the plugin's defaults with the source contrast in the objective (L + (L - L_rolled) on S~)"),
        _tb("gi-contrast-s2", ("--gradinit-iters", "200", "--seed", "2") + SOURCE_CONTRAST, "gi-contrast at seed 2"),
        _tb("gi-contrast10", ("--gradinit-iters", "200", "--gradinit-source-contrast", "10"),
            "variant: gi-contrast with the contrast weighted 10"),
        _tb("gi-contrast10-s2", ("--gradinit-iters", "200", "--seed", "2", "--gradinit-source-contrast", "10"),
            "gi-contrast10 at seed 2"),
        _tb("gi-contrast30", ("--gradinit-iters", "200", "--gradinit-source-contrast", "30"),
            "variant: gi-contrast with the contrast weighted 30"),
        _tb("gi-contrast30-s2", ("--gradinit-iters", "200", "--seed", "2", "--gradinit-source-contrast", "30"),
            "gi-contrast30 at seed 2"),
        _tb("gi-contrast100", ("--gradinit-iters", "200", "--gradinit-source-contrast", "100"),
            "variant: gi-contrast with the contrast weighted 100"),
        _tb("gi-margin", ("--gradinit-iters", "200", "--gradinit-source-contrast", "10", "--gradinit-source-margin",
                          "0.5"),
            "variant: the contrast weighted 10, rewarding the source gap only up to 0.5 bits per token"),
        _tb("gi-ceiling", ("--gradinit-iters", "200") + CONTRAST_10 + LOSS_CEILING,
            "variant: the contrast weighted 10 with a ceiling on L(S) at the learned scales: at most 0.35 nats "
            "(half a bit) per token above the first iteration's"),
        _tb("gi-ceiling-s2", ("--gradinit-iters", "200", "--seed", "2") + CONTRAST_10 + LOSS_CEILING,
            "gi-ceiling at seed 2"),
        _tb("gi-margin005", ("--gradinit-iters", "200") + CONTRAST_10 + ("--gradinit-source-margin", "0.05"),
            "variant: the contrast weighted 10, rewarding the source gap only up to 0.05 bits per token (below "
            "the gaps the simulated steps reach)"),
        _tb("gi-margin005-s2", ("--gradinit-iters", "200", "--seed", "2") + CONTRAST_10
            + ("--gradinit-source-margin", "0.05"), "gi-margin005 at seed 2"),
        _tb("gi-admin", WSKIP_ARCH + ADMIN_INIT + ("--gradinit-iters", "200"),
            "variant: GradInit (the plugin's defaults) on Admin's w_skip Transformer from Admin's initialization"),
        _tb("gi-admin-ceiling", WSKIP_ARCH + ADMIN_INIT + ("--gradinit-iters", "200") + CONTRAST_10 + LOSS_CEILING,
            "variant: gi-ceiling's GradInit (the contrast weighted 10, the loss ceiling) on Admin's w_skip "
            "Transformer from Admin's initialization"),
        _tb("gi-wskip", WSKIP_ARCH + ("--gradinit-iters", "200"),
            "variant: the paper's GradInit with w_skip: Admin's w_skip Transformer with omega = 1, the omegas scaled "
            "by GradInit with the rest (the plugin's defaults)"),
        _tb("gi-wskip-ceiling", WSKIP_ARCH + ("--gradinit-iters", "200") + CONTRAST_10 + LOSS_CEILING,
            "variant: gi-wskip with gi-ceiling's objective (the contrast weighted 10, the loss ceiling)"),
        _tb("gi-srcpin", ("--gradinit-iters", "200", "--gradinit-scale-bounds", SOURCE_PATH_PINNED),
            "variant: the plugin's defaults with the source path (encoder, shared embedding, cross-attention) "
            "pinned at scale 1"),
        _tb("gi-srcpin-s2", ("--gradinit-iters", "200", "--seed", "2", "--gradinit-scale-bounds", SOURCE_PATH_PINNED),
            "gi-srcpin at seed 2"),
    ),
    max_update=800,
    valid_every=100,
    save_every=800,
    parallel=2,
    throughput="cpu2",
    doc="""The README's quick-start model (transformer_iwslt_de_en, 6+6 layers, d=128, FFN 512, 4 heads,
--share-all-embeddings, dropout 0.3, label smoothing 0.1), Adam (0.9, 0.98), lr 1e-3 constant,
2048-token batches, seed 1, on the quick-start data-bin (scripts/prepare_corpus.py --vocab-size
6000). Every arm validates every 100 updates in eval mode and with dropout on
(--gradinit-valid-dropout-loss) and writes the training monitor's records every 100 updates.
Two arms at once, one thread each (--parallel 2 is the preset's; the runner sets OMP_NUM_THREADS).
GradInit phases are cached by their settings in --gradinit-cache (default OUT/gradinit): gi and
gi-warm50 share one. gi, gi-screen and the explanations pin the paper's setting that the plugin's
defaults had when batch 1 ran (gamma = 1/eta, one simulated step, tau 2.5e-3; the screening phase
tau 1e-2); the explanations and variants change one thing each; gi-default and gi-default-780 are the
plain usage line with the plugin's defaults since (gi-look4's settings). Run it on an otherwise idle machine; --dry-run prints the estimate from the
measured CPU speeds. Record and verdicts: lab/record/testbed-d128.md.""",
)


def seed_twin(preset: Preset, arm: Arm, seed: int) -> Arm:
    """``arm`` at another seed, named ``NAME-sSEED``. An arm that applies one of the preset's
    ``recompute`` files computes its own scales at that seed with the settings that made the file,
    as the file's scales fit only the initial weights of their own seed."""
    from .arms import merge_args, option_groups

    groups = option_groups(arm.args)
    args, extra = [], []
    for g in groups:
        key = g[1].strip("{}") if g[0] == "--gradinit-init-file" and len(g) == 2 else None
        if key is not None and key in preset.recompute:
            extra += list(preset.recompute[key])
        else:
            args += g
    twin = merge_args(extra + args, ["--seed", str(seed)])
    return Arm(f"{arm.name}-s{seed}", tuple(twin), drop=arm.drop, data=arm.data,
               note=f"{arm.name} at seed {seed}" + (" (its own GradInit scales)" if extra else ""))


PRESETS: Dict[str, Preset] = {p.name: p for p in (EVIDENCE, SCREEN, DEMO, ABLATE, CONFIRM, WSKIP, HOLD, SHOCK,
                                                   TESTBED)}


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


# -- a Post-LN decoder-only language model (lab/record/lm-nowarmup.md) ---------------------------
LM_BASE = (
    "--task", "language_modeling", "--arch", "transformer_lm_postln", "--decoder-layers", "6",
    "--decoder-embed-dim", "128", "--decoder-ffn-embed-dim", "512", "--decoder-attention-heads", "4",
    "--share-decoder-input-output-embed", "--dropout", "0.1", "--tokens-per-sample", "64",
    "--criterion", "cross_entropy", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "3e-3",
    "--lr-scheduler", "fixed", "--max-tokens", "1024", "--num-workers", "0",
)
GI_LM = ("--gradinit-iters", "100", "--gradinit-max-tokens", "1024", "--gradinit-log-interval", "10") \
    + _with(paper_defaults(3e-3), "--gradinit-lr", "1e-2")

LM = Preset(
    name="lm",
    answers=("whether GradInit lets a small Post-LN decoder-only language model train without warmup, against "
             "Xavier and a 300-update warmup"),
    docs="lab/record/lm-nowarmup.md",
    duration="with --cpu --no-bleu, 12 minutes on a shared 2-core VM (GradInit phase 106 s, then the three arms "
             "one after another, 113-260 s each: lab/record/lm-nowarmup.md)",
    summary="lab/record/lm-nowarmup.md: 6-layer d=128 Post-LN decoder-only LM (transformer_lm_postln) on the target "
            "side of the Debian corpus, lr 3e-3, Xavier / GradInit without warmup vs a 300-update warmup, "
            "600 updates (CPU: add --cpu --no-bleu)",
    base=LM_BASE,
    arms=(
        Arm("xavier", ("--seed", "1"), note="Xavier, no warmup"),
        Arm("gradinit", GI_LM + ("--seed", "1"), note="GradInit (100 iterations, the plugin's Adam defaults: eta = 2 x lr = "
                                                       "6e-3, gamma = 1/eta), no warmup"),
        Arm("warmup", ("--seed", "1", "--warmup-updates", "300"), note="Xavier, 300-update linear warmup"),
    ),
    max_update=600,
    valid_every=50,
    save_every=600,
    doc="""\
DATA is a language-model data-bin of the corpus's English side: fairseq-preprocess --only-source
--trainpref train.en --validpref valid.en --nwordssrc 8000 (whitespace tokens; the exact commands
are in lab/record/lm-nowarmup.md). Validation loss is in bits per token (fairseq's LM criterion);
perplexity is 2**loss. There is no BLEU: pass --no-bleu.""",
)

PRESETS[LM.name] = LM


# -- the testbed's model trained to convergence: BLEU against the baselines a reviewer accepts ------------
#: Updates of a converge arm; the linear decay reaches 0 here (--total-num-update), so a run with another
#: --max-update changes the schedule's length too only if --total-num-update is given with it.
CONVERGE_UPDATES = 4500
#: The paper's recipe scaled down: Adam (0.9, 0.98), lr 1e-3 decayed linearly to 0 over the run, no warmup
#: unless an arm adds one; the testbed's model, batches, monitor and validation passes otherwise.
CONVERGE_BASE = _with(TESTBED_BASE, "--lr-scheduler", "polynomial_decay") + (
    "--total-num-update", str(CONVERGE_UPDATES), "--end-learning-rate", "0", "--power", "1")
#: The paper's "Standard": inverse square root after a linear warmup, the warmup scaled to the run's length.
CONVERGE_STANDARD = ("--lr-scheduler", "inverse_sqrt", "--warmup-updates", "300", "--warmup-init-lr", "1e-7")
CONVERGE_DROP = ("--total-num-update", "--end-learning-rate", "--power")


def _converge_arms() -> Tuple[Arm, ...]:
    arms = (
        ("warmup", ("--warmup-updates", "200"), (), "linear warmup over 200 updates, then the linear decay "
                                                    "(the testbed's calibrated warmup; the comparator)"),
        ("warmup600", ("--warmup-updates", "600"), (), "linear warmup over 600 updates, then the linear decay"),
        ("standard", CONVERGE_STANDARD, CONVERGE_DROP, "the paper's Standard: inverse_sqrt, 300-update warmup"),
        ("xavier", (), (), "Xavier, no warmup, the linear decay"),
        ("admin", WSKIP_ARCH + ADMIN_INIT, (), "Admin's w_skip Transformer and initialization, no warmup"),
        ("gi-default", ("--gradinit-iters", "200"), (), "GradInit with the plugin's defaults, no warmup"),
        ("gi-contrast", ("--gradinit-iters", "200") + SOURCE_CONTRAST, (),
         "GradInit with the source contrast in its objective, no warmup"),
        ("gi-srcpin", ("--gradinit-iters", "200", "--gradinit-scale-bounds", SOURCE_PATH_PINNED), (),
         "GradInit with the source path pinned at scale 1, no warmup"),
        ("gi-ceiling", ("--gradinit-iters", "200") + CONTRAST_10 + LOSS_CEILING, (),
         "GradInit with the source contrast weighted 10 and the loss ceiling, no warmup"),
    )
    out = []
    for name, args, drop, note in arms:
        out.append(Arm(name, args, drop=drop, note=note))
        out.append(Arm(f"{name}-s2", args + ("--seed", "2"), drop=drop, note=f"{name} at seed 2"))
    return tuple(out)


CONVERGE = Preset(
    name="converge",
    answers=("at convergence on the CPU testbed: does a no-warmup arm reach the BLEU of the strongest warmup "
             "baseline while using its source"),
    docs="lab/record/testbed-d128.md",
    summary=f"the testbed's model with a linear decay to 0 over {CONVERGE_UPDATES} updates: warmup baselines "
            "(linear 200 and 600, the paper's Standard), Xavier, Admin and GradInit without warmup, two seeds each; "
            "validation (eval, dropout on, rolled sources) every 250 updates, BLEU at the end (add --cpu)",
    base=CONVERGE_BASE,
    arms=_converge_arms(),
    max_update=CONVERGE_UPDATES,
    valid_every=250,
    save_every=CONVERGE_UPDATES,
    parallel=2,
    throughput="cpu2",
    doc=f"""The testbed's model and data (preset testbed) trained to convergence: Adam (0.9, 0.98), lr 1e-3
decayed linearly to 0 over {CONVERGE_UPDATES} updates (polynomial_decay, power 1), with the warmups
the arms add; 'standard' is inverse_sqrt after a 300-update warmup. Every arm validates every 250
updates in eval mode, with dropout on and with the sources rolled across the batch (src_gap), and
BLEU is measured at the end (test split, beam 5; pass --bleu-ref with the raw test.en, and --bleu-best
with --save-every 500 for the best checkpoint by validation loss too). GradInit
phases are the testbed's (the schedule does not enter their fingerprint), so --gradinit-cache can
point at the testbed's. Its calibration is in lab/record/testbed-d128.md (3000 updates left the
warmup arm at BLEU 0.28; the length is now 4500, an hour per arm on one core).""",
)
PRESETS[CONVERGE.name] = CONVERGE
