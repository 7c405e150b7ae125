"""The CPU testbed's validation-loss tables in docs/no-warmup.md (lab/record/testbed-d128/): batch 1 at updates
400 and 800, and the two-seed batch 2 at 800 and 1000, each loss in eval mode and with dropout on, with the
monitor's gap warnings from the arm's training log."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence, Tuple

from ..study.tables import split_arm_name
from .records import TESTBED, as_stored, curves, gap_warnings

#: Batch 1's arms in the order they were run, with what each one is (the page's words; the flags are the
#: testbed preset's).
BATCH1_ARMS = {
    "xavier": "Xavier, no warmup",
    "warmup": "Xavier, 200-update linear warmup",
    "nodrop": "Xavier, no warmup, dropout 0",
    "nodrop-warmup": "Xavier, 200-update warmup, dropout 0",
    "gi": "GradInit, the plain usage line (`--gradinit-iters 780`)",
    "gi-screen": "GradInit, 200 iterations at τ 1e-2 (screening phase)",
    "gi-ratio": "screening phase + `--gradinit-max-step-ratio 0.5`",
    "gi-dropout": "screening phase + `--gradinit-dropout true`",
    "gi-look4": "screening phase + `--gradinit-gamma-init-factor 2 --gradinit-lookahead-steps 4`",
    "admin": "Admin's w_skip Transformer and initialization, Adam, no warmup",
    "radam": "Xavier, RAdam (0.9, 0.98), no warmup",
    "gi-pairs": "screening phase + the authors' S and S̃ (`--gradinit-pairs authors`)",
    "gi-unstepped": "screening phase + the tied output projection un-stepped in the simulated step",
    "gi-eta-lr": "screening phase + η = lr (1e-3) and γ = 1e3",
    "xavier-warm50": "Xavier, 50-update linear warmup",
    "gi-warm50": "`gi`'s scales, then the same 50-update warmup",
    "admin-s2": "`admin` at seed 2",
    "xavier-warm50-s2": "`xavier-warm50` at seed 2",
    "gi-K2": "screening phase + γ = 2 × the init's norm (`--gradinit-gamma-init-factor 2`), one simulated step",
    "gi-look4-g": "screening phase + four simulated steps, the paper's γ",
    "gi-floors": "screening phase + weights ≥ 0.1, LayerNorm weights ≥ 0.3",
    "gi-default-780": "the plugin's defaults with the paper's 780 iterations (`--gradinit-iters 780`)",
}

_SAME = "the same at seed 2"
#: Batch 2's arms (two seeds, 1000 updates), seed 1 and its seed-2 twin side by side where both decided.
BATCH2_ARMS = {
    "warmup": "Xavier, 200-update linear warmup",
    "gi-look4": "GradInit with the settings now the plugin's defaults (`--gradinit-iters 200`), no warmup",
    "warmup-s2": "Xavier, 200-update linear warmup",
    "gi-look4-s2": "GradInit with the settings now the plugin's defaults (`--gradinit-iters 200`), no warmup",
    "xavier-s2": "Xavier, no warmup",
    "gi-look4-floors": "the same with LayerNorm weights ≥ 0.3, other weights ≥ 0.1 (`--gradinit-scale-bounds`)",
    "gi-K2": "γ from the init with the paper's one simulated step (`--gradinit-gamma-init-factor 2 "
             "--gradinit-lookahead-steps 1`, 200 iterations), no warmup",
    "gi-K2-s2": _SAME,
    "gi-look4-floors-s2": "`gi-look4-floors` at seed 2",
    "gi-default-780": "the plugin's defaults with the paper's 780 iterations (`--gradinit-iters 780`), no warmup",
    "gi-default-780-s2": _SAME,
}


def _losses(c: Mapping[str, Mapping[int, float]], u: int) -> str:
    return f"{as_stored(c['valid_loss'].get(u))} / {as_stored(c['valid_loss_dropout'].get(u))}"


def loss_table(folder: Path, arms: Mapping[str, str], updates: Tuple[int, int], *, seed_column: bool) -> str:
    """One row per arm of ``arms`` (name -> what it is): eval-mode / dropout-on validation loss at ``updates``
    as stored, and the monitor's gap warnings; with ``seed_column``, the seed from the arm's name."""
    data = curves(folder)
    missing = [a for a in arms if a not in data]
    if missing:
        raise ValueError(f"{folder / 'curves.csv'} has no arm {missing}")
    first, last = updates
    head = ["arm"] + (["seed"] if seed_column else []) + ["what"]
    if seed_column:
        head += [f"at {first}: eval / dropout on", f"at {last}: eval / dropout on"]
    else:
        head += [f"valid loss at {first}: eval / dropout on", f"at {last}: eval / dropout on"]
    head.append("monitor's gap warnings")
    lines = ["| " + " | ".join(head) + " |",
             "|---|" + ("---|" if seed_column else "") + "---|---:|---:|---:|"]
    for arm, what in arms.items():
        seed = [str(split_arm_name(arm)[1] or 1)] if seed_column else []
        cells = [f"`{arm}`", *seed, what, _losses(data[arm], first), _losses(data[arm], last),
                 str(gap_warnings(folder, arm))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def testbed_table() -> str:
    """Batch 1 of the CPU testbed: 800 updates, seed 1 unless the name says otherwise."""
    return loss_table(TESTBED, BATCH1_ARMS, (400, 800), seed_column=False)


def two_seeds_table() -> str:
    """Batch 2 of the CPU testbed: the arms that decided by loss, to 1000 updates at two seeds."""
    return loss_table(TESTBED / "batch2", BATCH2_ARMS, (800, 1000), seed_column=True)


def arms_of(table: str) -> Sequence[str]:
    """The arm names of a rendered table, in order (for the tests' properties)."""
    return [line.split("|")[1].strip(" `") for line in table.splitlines()[2:]]
