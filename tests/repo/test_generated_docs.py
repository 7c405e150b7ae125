"""The docs' tables of measurements are generated from the stored records (``python -m lab.render_docs``): one
test re-renders them all and compares; each table has at most one test of what it shows (which arms break down,
which hold), so that a re-measurement that changes a conclusion fails here and not in a sentence's pin."""
import json

from lab.render_docs import TABLES, render, source_use_table


def _rows(table: str):
    """arm -> its cells (the arm's own cell without backquotes and description) of a rendered table."""
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].split(":")[0].strip("` ")] = cells
    return rows


def test_every_generated_table_is_fresh():
    assert render(check=True) == [], "run: python -m lab.render_docs"


def test_the_source_use_table_judges_by_source_use_not_loss():
    """Every GradInit arm of the stored testbed runs whose loss beat the warmup run's but whose source gap stayed
    near 0 is a 'fails' row; the comparator is named as such."""
    rows = [line for line in source_use_table().splitlines()[2:] if line.startswith("| `")]
    by_arm = {r.split("|")[1].strip(" `"): [c.strip() for c in r.split("|")[1:-1]] for r in rows}
    assert by_arm["warmup"][-1] == "the comparator"
    for arm, cells in by_arm.items():
        gap_1000 = cells[6]
        if not arm.startswith("warmup") and gap_1000 != "–" and float(gap_1000) < 0.05:
            assert cells[-1].startswith("fails: source gap"), arm
    assert set(TABLES) == {"source-use", "testbed-d128", "testbed-d128-two-seeds", "hold-a", "hold",
                           "remedies-hold-a", "clamp-health", "health-layer-norm-gains", "health-decoder-quieting",
                           "quickstart-timings", "threads", "headline"}


def test_an_arm_is_judged_against_the_comparator_run_of_its_own_seed(tmp_path):
    """A seed-2 arm whose gap is close to the seed-2 warmup run's holds, though it is far below seed 1's."""
    rows = ["arm,num_updates,valid_loss,valid_src_gap"]
    for arm, gap in (("warmup", 1.5), ("warmup-s2", 0.6), ("gi-x-s2", 0.5), ("gi-x", 0.5)):
        rows += [f"{arm},{u},8.0,{gap}" for u in (500, 1000)]
    batch = tmp_path / "batch1"
    batch.mkdir()
    (batch / "curves.csv").write_text("\n".join(rows) + "\n")
    table = source_use_table([batch])
    verdicts = {r.split("|")[1].strip(" `"): r.split("|")[-2].strip() for r in table.splitlines()[2:]}
    assert verdicts["warmup-s2"] == "the comparator"
    assert verdicts["gi-x-s2"] == "holds"
    assert verdicts["gi-x"].startswith("fails: source gap 0.50 bits at 500, 1.00 below warmup's")


def test_the_testbed_arms_with_gap_warnings_are_those_broken_down_in_eval_mode():
    """Batch 1 (docs/no-warmup.md): the faithful method and its near variants break down in eval mode (eval-mode
    loss far above the dropout-on loss at 800, the monitor's gap warnings), and those are the only arms with a
    warning; every arm the table names is an arm of the testbed preset."""
    from lab.docs_tables.testbed import testbed_table
    from lab.study.presets import TESTBED

    rows = _rows(testbed_table())
    at800 = {arm: [float(x) for x in cells[3].split(" / ")] for arm, cells in rows.items()}
    warned = {arm for arm, cells in rows.items() if int(cells[4]) > 0}
    broken = {arm for arm, (eval_loss, dropout_loss) in at800.items() if eval_loss - dropout_loss > 0.5}
    assert warned == broken == {"gi", "gi-screen", "gi-ratio", "gi-pairs", "gi-floors"}
    assert set(rows) <= {a.name for a in TESTBED.arms}


def test_no_d512_run_without_warmup_held_and_fp32_never_overflowed():
    """lab/record/no-warmup.md's preset `hold` call A: every arm's eval mode breaks down before its last update
    and its last loss is above its best; the fp16 arms overflow after start-up, fp32 never; start-up's overflow
    (left out of the table) is at update 3 only."""
    from lab.docs_tables.hold import HOLD_A, HOLD_A_ARMS, STARTUP_UPDATE, hold_a_table
    from lab.docs_tables.records import monitor

    rows = _rows(hold_a_table())
    for arm, cells in rows.items():
        best, last = (float(c.split(" @ ")[0]) for c in cells[4:6])
        assert int(cells[6]) < int(cells[5].split(" @ ")[1].split()[0]) and last > best, arm
        assert (int(cells[7]) == 0) == (arm == "fp32"), arm
        assert all(r["update"] == STARTUP_UPDATE
                   for r in monitor(HOLD_A, arm) if r["type"] == "overflow" and r["update"] <= STARTUP_UPDATE), arm
    assert set(rows) == set(HOLD_A_ARMS)


def test_gradinit_without_warmup_leads_the_warmup_run_to_800_and_trails_from_900():
    """The claim of docs/no-warmup.md and the record on the earlier pair, at every validation (the table shows
    a few)."""
    from lab.docs_tables.hold import HOLD
    from lab.docs_tables.records import curves

    gi, warm = (curves(HOLD)[arm]["valid_loss"] for arm in ("gi98-s1", "warm-s1"))
    common = sorted(set(gi) & set(warm))
    assert all(gi[u] < warm[u] for u in common if u <= 800) and all(gi[u] > warm[u] for u in common if u >= 900)


def test_clamping_takes_the_weights_off_the_floor_but_the_verdict_stays_degenerate():
    """docs/remedies.md's clamp table: both clamps leave no weight at the floor, every row is still
    'degenerate', all measured on the same batch; the Xavier range the page states is the records'."""
    from lab.docs_tables.health import CLAMP_ROWS, clamp_health_table, health_of

    rows = _rows(clamp_health_table())
    assert [cells[-1] for cells in rows.values()] == ["degenerate"] * 3
    assert int(rows["as learned"][1]) > 0 and all(int(c[1]) == 0 for label, c in rows.items() if label != "as learned")
    records = [health_of(path) for path in CLAMP_ROWS.values()]
    assert all(h["batch"] == {"sentences": 160, "tokens": 2201} for h in records)
    before = [n["gain_before"] for n in records[0]["norms"]]
    page = (TABLES["clamp-health"][0]).read_text(encoding="utf-8")
    assert f"(Xavier:\n{min(before):.2f}–{max(before):.2f})" in page


def test_the_highest_gains_of_the_collapsed_scales_are_over_the_threshold_from_xavier_like_ones():
    """docs/health.md's worked example: each LayerNorm the table shows has a gain after the scales above the
    check's `max_gain` and more than `max_gain_ratio` times its gain before, which is near Xavier's (below 1.1)."""
    from lab.docs_tables.health import AUTHORS_D512, health_of, layer_norm_gains_table

    thresholds = health_of(AUTHORS_D512)["thresholds"]
    for cells in _rows(layer_norm_gains_table()).values():
        before, after = float(cells[2]), float(cells[4])
        assert before < 1.1 and after > thresholds["max_gain"] and after > thresholds["max_gain_ratio"] * before


def test_the_timed_quick_starts_ran_as_written_and_the_idle_one_alone():
    """docs/fairseq.md's timings: both runs did the quick start's 20 GradInit iterations, all on the objective;
    the idle run's log has no warning that PyTorch shares its threads with other jobs."""
    from lab.docs_tables.quickstart import IDLE, LOADED

    for record in (IDLE, LOADED):
        info = json.loads((record / "gradinit.json").read_text(encoding="utf-8"))
        assert info["num_objective"] == info["iterations"] == 20, record.name
    assert "PyTorch uses" not in (IDLE / "train.log").read_text(encoding="utf-8")
