"""python -m lab.study_table and lab.study.tables: the per-seed confirmation table."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.study.tables import build_table, markdown, split_arm_name, to_json

REPO = Path(__file__).resolve().parents[2]
LAB_TABLE = [sys.executable, "-m", "lab.study_table"]  # run from the checkout's root
FIELDS = ("arm", "num_updates", "valid_loss", "valid_nll_loss", "train_loss", "train_nll_loss",
          "loss_scale", "lr", "gnorm", "wall_s")


def _study(tmp_path, curves, bleu=None):
    with open(tmp_path / "curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for arm, points in curves.items():
            for u, (valid, train) in sorted(points.items()):
                w.writerow({"arm": arm, "num_updates": u, "valid_loss": "" if valid is None else valid,
                            "train_loss": "" if train is None else train})
    if bleu is not None:
        (tmp_path / "bleu.json").write_text(json.dumps(bleu))
    return tmp_path


def test_split_arm_name():
    assert split_arm_name("gi98-s2") == ("gi98", 2)
    assert split_arm_name("x98") == ("x98", None)
    assert split_arm_name("warm-s10") == ("warm", 10)


def test_table_values_means_and_missing(tmp_path):
    sig = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"
    d = _study(tmp_path, {
        "gi98-s1": {500: (8.0, 8.5), 1000: (7.0, 7.5), 1100: (None, 7.4)},
        "gi98-s2": {500: (9.0, 8.7), 1000: (8.0, 7.9)},
        "x98-s1": {500: (9.7, 9.8)},  # stopped before update 1000
    }, bleu={"update": 1000, "arms": {"gi98-s1": {"bleu": 20.0, "signature": sig},
                                      "gi98-s2": {"bleu": 22.0, "signature": sig},
                                      "x98-s1": {"bleu": None, "reason": "no checkpoint at update 1000"}}})
    t = build_table(d, updates=[1000, 500])
    assert t.updates == (500, 1000) and t.train_at == 1000
    rows = {r.arm: r for r in t.rows}
    assert rows["gi98-s1"].valid == {500: 8.0, 1000: 7.0} and rows["gi98-s1"].train == 7.5
    assert rows["x98-s1"].valid[1000] is None and rows["x98-s1"].train == 9.8  # last logged at or before 1000
    assert rows["x98-s1"].bleu is None and "no checkpoint" in rows["x98-s1"].bleu_note
    j = to_json(t)
    assert j["means"]["gi98"]["valid"] == {"500": 8.5, "1000": 7.5} and j["means"]["gi98"]["bleu"] == 21.0
    assert "x98" not in j["means"]  # one seed: no mean row
    text = markdown(t)
    assert "| `gi98` | **mean** | 8.50 | 7.50 | 7.70 |  | 21.00 |" in text
    assert "| `x98` | 1 | 9.70 | – |" in text and sig in text


def test_mean_needs_every_seed(tmp_path):
    d = _study(tmp_path, {"a-s1": {500: (8.0, 8.0)}, "a-s2": {400: (9.0, 9.0)}})
    assert to_json(build_table(d, updates=[500]))["means"]["a"]["valid"] == {"500": None}


def test_cli(tmp_path):
    (tmp_path / "s").mkdir()
    d = _study(tmp_path / "s", {"g-s1": {100: (9.0, 9.5)}, "g-s2": {100: (8.0, 8.5)}})
    out = subprocess.run([*LAB_TABLE, str(d), "--updates", "100", "--json", str(tmp_path / "t.json")],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "| `g` | **mean** | 8.50 |" in out.stdout
    assert json.loads((tmp_path / "t.json").read_text())["means"]["g"]["train"] == 9.0
    bad = subprocess.run([*LAB_TABLE, str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "has no curves.csv" in bad.stderr and "Traceback" not in bad.stderr
    bad = subprocess.run([*LAB_TABLE, str(d), "--updates", "x"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "--updates" in bad.stderr
    bad = subprocess.run([*LAB_TABLE, str(d), "--arms", "nope"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "arms not in" in bad.stderr


def test_bad_updates(tmp_path):
    d = _study(tmp_path, {"a": {1: (1.0, 1.0)}})
    with pytest.raises(ValueError, match="positive"):
        build_table(d, updates=[0])


@pytest.mark.parametrize("damage, expected", [
    (lambda text: "", "curves.csv is empty (no header line)"),
    (lambda text: text[:text.rindex(",", 0, len(text) - 2)], "curves.csv, line 4: 8 fields where the header has 10"),
    (lambda text: text.replace("8.5", "8.5x", 1), "curves.csv, line 2: train_loss '8.5x' is not a number"),
    (lambda text: text.replace("g-s1,100,", "g-s1,1e,", 1), "curves.csv, line 2: num_updates '1e' is not an update"),
    (lambda text: text + text.splitlines()[1] + "\n", "curves.csv, line 5: arm 'g-s1' at update 100 again (first "
                                                      "at line 2)"),
    (lambda text: "\n".join(text.splitlines()[:2]) + "\n", "has no rows of arm 'g-s2', which"),
    (lambda text: "\n".join(text.splitlines()[:3]) + "\n", "ends arm 'g-s2' at update 100, but"),
    (lambda text: text.replace("arm,num_updates", "name,update"), "curves.csv, line 1: the header"),
])
def test_partial_or_damaged_curves_csv_is_refused_naming_file_and_line(tmp_path, damage, expected):
    """A table from a file that is not whole would look like data: the CLI refuses it, one line, exit 2."""
    d = _study(tmp_path, {"g-s1": {100: (9.0, 8.5)}, "g-s2": {100: (8.0, 8.4), 200: (7.0, 7.5)}})
    (d / "study.json").write_text(json.dumps({"arms": {
        "g-s1": {"trained": True, "last_update": 100}, "g-s2": {"trained": True, "last_update": 200},
        "ref": {"trained": False}}}))
    build_table(d, updates=[100])  # the whole file is fine
    csv_path = d / "curves.csv"
    csv_path.write_text(damage(csv_path.read_text()))
    proc = subprocess.run([*LAB_TABLE, str(d), "--updates", "100"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("study_table: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert expected in proc.stderr and str(csv_path) in proc.stderr, proc.stderr


def test_damaged_bleu_json_is_named(tmp_path):
    d = _study(tmp_path, {"g-s1": {100: (9.0, 8.5)}})
    (d / "bleu.json").write_text('{"update": 100, "arms": ')
    proc = subprocess.run([*LAB_TABLE, str(d), "--updates", "100"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(f"study_table: error: {d / 'bleu.json'} is not a bleu.json of python -m lab.study (")
    assert proc.stderr.count("\n") == 1
