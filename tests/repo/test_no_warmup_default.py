"""The plugin's Adam defaults are what reached the lowest validation loss without warmup on the CPU testbed (a model
that ignores its source, as tests/repo/test_generated_docs.py's table shows): the pages that quote those losses
(README, docs/fairseq.md, docs/no-warmup.md) are checked against the stored curves of the testbed's second batch
(two seeds, 1000 updates) and against the constants and preset arms they name."""
import gzip
import re
from pathlib import Path

import pytest
from test_docs_no_warmup import TESTBED, curves_of_testbed

REPO = Path(__file__).resolve().parents[2]
BATCH2 = TESTBED / "batch2"
#: The no-warmup arm and its warmup reference of each seed.
PAIRS = {1: ("gi-look4", "warmup"), 2: ("gi-look4-s2", "warmup-s2")}


def _flat(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def _curves():
    return curves_of_testbed(BATCH2)


def _gap_warnings(arm: str) -> int:
    with gzip.open(BATCH2 / "arms" / arm / "train.log.gz", "rt", encoding="utf-8") as f:
        return sum("monitor: eval - train loss" in line for line in f)


def _arm(name):
    from lab.study.presets import TESTBED

    return next(a for a in TESTBED.arms if a.name == name)


#: gamma from the init with the paper's one simulated step, against the same warmup arms.
PAIRS_K2 = {1: ("gi-K2", "warmup"), 2: ("gi-K2-s2", "warmup-s2")}
#: The defaults with floors on every scale (LayerNorm weights >= 0.3, other weights >= 0.1).
PAIRS_FLOORS = {1: ("gi-look4-floors", "warmup"), 2: ("gi-look4-floors-s2", "warmup-s2")}
#: The defaults at the paper's 780 iterations: did not hold (a gap warning at seed 2).
PAIRS_780 = {1: ("gi-default-780", "warmup"), 2: ("gi-default-780-s2", "warmup-s2")}


@pytest.mark.parametrize("pairs", [PAIRS, PAIRS_K2, PAIRS_FLOORS], ids=["default", "gamma-from-init", "floors"])
def test_the_default_has_the_lower_loss_on_both_seeds_to_1000_updates(pairs):
    """The loss-only criterion these arms met (and which no longer decides, see docs/no-warmup.md): without
    warmup, eval-mode validation loss below the 200-update warmup arm's at every validation, on two seeds, no gap
    warning."""
    curves = _curves()
    for seed, (gi, warm) in pairs.items():
        assert max(curves[gi]) == max(curves[warm]) == 1000, seed
        assert all(curves[gi][u][0] < curves[warm][u][0] for u in curves[warm]), seed
        assert _gap_warnings(gi) == 0, gi
        assert "--warmup-updates 200" in " ".join(_arm(warm).args) and "--warmup-updates" not in _arm(gi).args
        assert (tuple(_arm(gi).args[-2:]) == ("--seed", "2")) == (seed == 2) == ("--seed" in _arm(gi).args)


def test_the_defaults_at_780_iterations_did_not_hold_and_the_pages_say_so():
    """Below the warmup arm at 800 and 1000 on both seeds, but a gap warning at seed 2 (an eval-mode jump at
    update 200 above the warmup arm): not 'holds'; docs/no-warmup.md and docs/fairseq.md say so."""
    curves = _curves()
    for seed, (gi, warm) in PAIRS_780.items():
        assert all(curves[gi][u][0] < curves[warm][u][0] for u in (800, 1000)), seed
        assert ("--warmup-updates" not in _arm(gi).args) and "--gradinit-iters 780" in " ".join(_arm(gi).args)
    assert [_gap_warnings(gi) for gi, _ in PAIRS_780.values()] == [0, 1]
    s2 = curves["gi-default-780-s2"][200]
    assert s2[0] > curves["warmup-s2"][200][0] and s2[0] > s2[1]
    page = _flat(REPO / "docs" / "no-warmup.md")
    assert (f"the eval-mode loss jumps at update 200 ({s2[0]:.2f} against the warmup run's "
            f"{curves['warmup-s2'][200][0]:.2f}, a gap warning) before it comes down below the warmup run "
            f"({curves['gi-default-780-s2'][1000][0]:.2f} at 1000; next section)") in page


def test_the_pages_state_the_defaults_that_were_measured():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.settings.options import (
        NO_WARMUP_GAMMA_INIT_FACTOR,
        NO_WARMUP_LOOKAHEAD_STEPS,
        NO_WARMUP_TAU,
    )

    args = _arm("gi-look4").args
    flags = dict(zip(args[::2], args[1::2]))
    assert float(flags["--gradinit-gamma-init-factor"]) == NO_WARMUP_GAMMA_INIT_FACTOR
    assert int(flags["--gradinit-lookahead-steps"]) == NO_WARMUP_LOOKAHEAD_STEPS
    assert float(flags["--gradinit-lr"]) == NO_WARMUP_TAU
    iters = flags["--gradinit-iters"]
    fairseq_md = _flat(REPO / "docs" / "fairseq.md")
    assert f"(`--gradinit-gamma-init-factor {NO_WARMUP_GAMMA_INIT_FACTOR:g}`)" in fairseq_md
    assert f"(`--gradinit-lookahead-steps {NO_WARMUP_LOOKAHEAD_STEPS}`" in fairseq_md
    assert NO_WARMUP_TAU == 1e-2 and "τ = 1e-2" in fairseq_md
    assert f"The testbed ran {iters} iterations (`--gradinit-iters {iters}`)" in fairseq_md
    readme = _flat(REPO / "README.md")
    assert f"the plugin's Adam defaults (`--gradinit-iters {iters}`)" in readme
    assert f"--gradinit-iters {iters}`, any task" in readme


def test_the_papers_flags_on_the_page_give_the_authors_configuration():
    """docs/fairseq.md's line for the paper's GradInit resolves to the authors' IWSLT recipe at lr 5e-4."""
    pytest.importorskip("fairseq")
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.core.recipes import recipe
    from fairseq_gradinit.fairseq_plugin.settings.option_values import gradinit_config_from_task

    page = _flat(REPO / "docs" / "fairseq.md")
    line = re.search(r"The paper's GradInit for Adam, as the authors' IWSLT launch script runs it, is `([^`]+)`", page)
    argv = ["data-bin-not-read", "--task", "translation", "--arch", "transformer_iwslt_de_en", "--optimizer", "adam",
            "--lr", "5e-4", "--max-tokens", "4096", *line.group(1).split()]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    g = gradinit_config_from_task(cfg.task)
    # "on the testbed it did worse than no GradInit at all": batch 1's gi (the paper's setting) against Xavier
    batch1 = curves_of_testbed()
    assert "on the testbed it did worse than no GradInit at all" in page
    assert batch1["gi"][800][0] > batch1["xavier"][800][0]
    authors = recipe("authors-iwslt14").values
    assert (g.eta, g.resolved_gamma, g.lr, g.iters, g.lookahead_steps, g.gamma_init_factor) == (
        authors["eta"], authors["gamma"], authors["lr"], authors["iters"], 1, None)


def _scales(arm):
    import json

    for study in sorted(BATCH2.glob("study-*.json")):
        info = json.loads(study.read_text(encoding="utf-8"))
        group = info["arms"].get(arm, {}).get("gradinit_group")
        if group:
            return json.loads((BATCH2 / "gradinit" / group / "gradinit.json").read_text(encoding="utf-8"))["scales"]
    raise AssertionError(f"no scales of {arm}")


def test_the_sentences_under_the_table_are_the_stored_runs():
    """docs/no-warmup.md's reading of the two-seed table, where the table cannot carry it: the encoder's last
    LayerNorm at the floor on both seeds, at 0.3 with the floors, and BLEU of every arm that has one."""
    import json

    page = _flat(REPO / "docs" / "no-warmup.md")
    last_ln = "encoder.layers.5.final_layer_norm.weight"
    for gi, _ in PAIRS.values():
        assert abs(_scales(gi)[last_ln] - 0.01) < 1e-4, gi
    assert abs(_scales("gi-look4-floors")[last_ln] - 0.3) < 1e-6
    assert "the encoder's last LayerNorm sits at the 0.01 floor" in page and "stays at 0.3" in page
    bleu = {p.parent.name: json.loads(p.read_text(encoding="utf-8")) for p in BATCH2.glob("arms/*/bleu.json")}
    assert set(bleu) == {a for pair in PAIRS.values() for a in pair}
    for b in bleu.values():
        assert b["bleu"] < 0.3 and b["beam"] == 5 and b["subset"] == "test" and b["n_sentences"] == 1500
        command = " ".join(b["generate_command"])
        assert "--max-len-a 1.2 --max-len-b 10" in command
    assert ("no arm translates (BLEU below 0.4 on the test split, beam 5, outputs of at most 1.2 × the "
            "source length + 10)") in page


def test_the_readme_states_the_quick_start_times_of_the_stored_runs():
    import re
    from datetime import datetime

    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    idle = REPO / "lab" / "record" / "quickstart-translation-idle" / "times.txt"
    steps = [float(x) for x in re.findall(r"step\d ([\d.]+) s", idle.read_text(encoding="utf-8"))]
    log = REPO / "lab" / "record" / "quickstart-translation" / "train.log"
    stamps = [datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
              for line in log.read_text(encoding="utf-8").splitlines() if line[:2] == "20"]
    shared = (stamps[-1] - stamps[0]).total_seconds()
    assert (f"On an otherwise idle 2-core CPU the three steps took {steps[0]:.0f} s, {steps[1]:.0f} s and "
            f"{steps[2]:.0f} s; with other jobs on both cores, step 2 took {shared:.0f} s") in readme


def test_the_sentences_on_what_makes_the_variant_train_are_the_stored_runs():
    """docs/no-warmup.md's bullets under the testbed's table, where the table cannot carry them: `gi-K2` below the
    warmup run at every validation (the table shows two), and the count of constraint iterations of
    `gi-look4-g`'s phase. Their losses are the generated table's."""
    import json

    page = _flat(REPO / "docs" / "no-warmup.md")
    one = curves_of_testbed()
    assert all(one["gi-K2"][u][0] < one["warmup"][u][0] for u in one["warmup"])
    assert "below the warmup run at every validation); with four simulated steps" in page
    study = json.loads((TESTBED / "study-study8.json").read_text(encoding="utf-8"))
    group = study["arms"]["gi-look4-g"]["gradinit_group"]
    phase = json.loads((TESTBED / "gradinit" / group / "gradinit.json").read_text(encoding="utf-8"))
    assert f"binds in {phase['num_constraint']} of {phase['iterations']} iterations" in page
