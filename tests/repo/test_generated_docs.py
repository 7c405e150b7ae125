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
        gap_1000 = cells[5]
        if arm != "warmup" and gap_1000 != "–" and float(gap_1000) < 0.05:
            assert cells[-1].startswith("fails: source gap"), arm
    assert set(TABLES) == {"source-use"}
