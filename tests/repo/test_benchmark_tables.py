"""The benchmark numbers in docs/fairseq.md, benchmarks/README.md and docs/vision.md are generated from
benchmarks/results/*.json, and a changed result makes them stale."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("benchmark_tables_under_test", REPO / "scripts" / "benchmark_tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)


def test_generated_benchmark_numbers_are_current():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark_tables.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_block_is_used_and_every_result_file_is_shown():
    text = "".join((REPO / f).read_text(encoding="utf-8") for f in tables.FILES)
    used = {m.group(1) for m in tables.BLOCK.finditer(text)}
    assert used == set(tables.BLOCKS)
    for path in (REPO / "benchmarks" / "results").glob("*.json"):
        if path.stem != "bookkeeping_ops":  # counted operators, quoted in prose
            assert path.stem in used, path.name


def test_a_changed_result_makes_the_files_stale(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(REPO / "benchmarks" / "results", results)
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    monkeypatch.setattr(tables, "RESULTS", results)
    assert tables.render(text) == text
    d = json.loads((results / "vision_cpu.json").read_text(encoding="utf-8"))
    d["results"][2]["ratios"]["constraint_time"] = 4.5
    (results / "vision_cpu.json").write_text(json.dumps(d), encoding="utf-8")
    new = tables.render(text)
    low = min(row["ratios"]["constraint_time"] for row in d["results"])
    assert new != text and "4.50× ✗" in new and f"{low:.2f}–4.50×" in new


def test_unknown_block_is_refused():
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        tables.render("<!-- bench:nope --><!-- /bench -->")


def test_the_prose_about_the_idle_cpu_vision_run_is_its_json():
    import json

    rows = json.loads((REPO / "benchmarks" / "results" / "vision_cpu.json").read_text())["results"]
    r = [row["ratios"] for row in rows]
    vision = (REPO / "docs" / "vision.md").read_text(encoding="utf-8").replace("\n", " ")
    bench = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8").replace("\n", " ")
    cpu = lambda key: " / ".join(f"{x[key]:.2f}×" for x in r)  # noqa: E731
    assert f"(objective {cpu('objective_cpu_time')}, constraint {cpu('constraint_cpu_time')})" in vision
    worst = max(abs(x[k + "_cpu_time"] - x[k + "_time"]) / x[k + "_time"] for x in r for k in ("objective", "constraint"))
    assert worst < 0.03 and "agree with the wall-clock ones within 3%" in bench
    obj = [x["objective_time"] for x in r]
    cons = [x["constraint_time"] for x in r]
    fd = [x["constraint_fd_time"] for x in r]
    assert f"sit at the two-pass floor ({min(obj):.2f}–{max(obj):.2f}×)" in bench
    assert f"cost {min(cons):.2f}–{max(cons):.2f}× a training step on the CPU, and the finite-difference ones " \
           f"{min(fd):.2f}–{max(fd):.2f}×" in vision
