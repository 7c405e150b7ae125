"""The docs' tables of measurements are generated from the stored records (``python -m lab.render_docs``)."""
from lab.render_docs import TABLES, render, source_use_table


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
    assert set(TABLES) == {"source-use"}


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
