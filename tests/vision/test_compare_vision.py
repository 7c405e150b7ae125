"""gradinit-compare-vision end to end at tiny size: the quick start's command path, on Fashion-MNIST when the
Debian package is installed and on synthetic images otherwise."""
import json
import re
import math
from pathlib import Path

import pytest

from fairseq_gradinit.core.progress import format_duration
from fairseq_gradinit.tools import compare_vision as cv
from fairseq_gradinit.tools.train_vision import cli as tv
from fairseq_gradinit.tools.train_vision.data import find_fashion_mnist

REPO = Path(__file__).resolve().parents[2]
MAX_LINE = 300


def fashion_mnist_installed() -> bool:
    try:
        find_fashion_mnist(None)
    except FileNotFoundError:
        return False
    return True


def tiny_argv(tmp_path):
    data = (["--dataset", "fashion-mnist"] if fashion_mnist_installed() else
            ["--dataset", "synthetic", "--synthetic-train-size", "96", "--synthetic-test-size", "32"])
    return [*data, "--width", "0.125", "--batch-size", "8", "--steps", "6", "--gradinit-iters", "3",
            "--test-batches", "2", "--test-batch-size", "16", "--log-interval", "2", "--threads", "1",
            "--no-progress", "--output-dir", str(tmp_path / "cmp")]


def test_compare_prints_the_difference_and_writes_json_and_plot(tmp_path, capsys):
    assert cv.main(tiny_argv(tmp_path)) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    runs = result["runs"]
    assert list(runs) == ["kaiming", "gradinit"]
    for r in runs.values():
        assert r["steps"] == 6 and r["test_images"] == 32 and 0 <= r["test_acc"] <= 100
        assert [p["step"] for p in r["curve"]] == [2, 4, 6]
        assert all(math.isfinite(p["loss"]) and 0 <= p["acc"] <= 100 for p in r["curve"])
        assert json.loads((Path(r["output_dir"]) / "log.json").read_text())["epochs"][-1]["test_acc"] == r["test_acc"]
    assert runs["kaiming"]["init_wall_time"] is None and runs["kaiming"]["gradinit_iterations"] is None
    assert sum(runs["gradinit"]["gradinit_iterations"].values()) == 3 and runs["gradinit"]["init_wall_time"] > 0
    diff = runs["gradinit"]["test_acc"] - runs["kaiming"]["test_acc"]
    assert f"GradInit - Kaiming: {diff:+.1f} points of test accuracy after 6 steps" in out
    assert result["conditions"]["torch_threads"] == 1
    png = (tmp_path / "cmp" / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert max(len(line) for line in out.splitlines()) <= MAX_LINE


def test_kaiming_run_is_the_train_vision_run_of_the_same_flags(tmp_path):
    """The comparison's baseline is exactly gradinit-train-vision --init kaiming with the same settings."""
    args = cv.get_args_parser().parse_known_args(tiny_argv(tmp_path))
    argv = cv.arm_argv(*args[:1], "kaiming", args[1])
    argv[argv.index("--output-dir") + 1] = str(tmp_path / "direct")
    direct = tv.main(tv.get_args_parser().parse_args(argv))
    assert cv.main(tiny_argv(tmp_path)) == 0
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert result["runs"]["kaiming"]["test_acc"] == direct["epochs"][-1]["test_acc"]
    assert result["runs"]["kaiming"]["curve"] == [{k: r[k] for k in ("step", "loss", "acc")} for r in direct["steps"]]


def test_a_mistyped_flag_stops_before_any_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cv.main([*tiny_argv(tmp_path), "--no-such-flag"])
    assert e.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def test_quick_start_page_quotes_the_stored_run():
    """docs/quickstart-vision.md: its table is the stored run's, its command the one that made it, and its
    GPU figures are those of docs/fmnist-gpu-results.json."""
    doc = (REPO / "docs" / "quickstart-vision.md").read_text(encoding="utf-8")
    stored = json.loads((REPO / "docs" / "compare-vision.json").read_text(encoding="utf-8"))
    assert cv.result_table(stored) in doc
    assert (REPO / "docs" / "compare-vision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    defaults = cv.get_args_parser().parse_args([])
    for key in ("model", "bn", "width", "batch_size", "steps", "gradinit_iters", "seed"):
        assert stored[key] == getattr(defaults, key), key
    assert stored["extra_flags"] == [] and stored["conditions"]["torch_threads"] == 1
    assert "OMP_NUM_THREADS=1 gradinit-compare-vision --output-dir runs/compare-vision" in doc
    runs = stored["runs"]
    diff = runs["gradinit"]["test_acc"] - runs["kaiming"]["test_acc"]
    assert f"GradInit ends {diff:.0f} points of test accuracy above Kaiming's initialization after the same " \
           f"{stored['steps']} steps,\nand its training loss is below Kaiming's from step 30 on." in doc
    loaded = json.loads((REPO / "docs" / "compare-vision-loaded.json").read_text(encoding="utf-8"))
    assert all(loaded["runs"][i]["test_acc"] == r["test_acc"] for i, r in runs.items())  # same run, another load
    assert f"gave the same accuracies in {format_duration(loaded['wall_time'])} (" in doc
    kaiming = {p["step"]: p["loss"] for p in runs["kaiming"]["curve"]}
    assert all(p["loss"] < kaiming[p["step"]] for p in runs["gradinit"]["curve"] if p["step"] >= 30)
    gpu = json.loads((REPO / "docs" / "fmnist-gpu-results.json").read_text(encoding="utf-8"))
    gi = [v["acc_1"] for k, v in gpu.items() if k.startswith("resnet110--no-bn-gradinit")]
    km = [v["acc_1"] for k, v in gpu.items() if k.startswith("resnet110--no-bn-kaiming")]
    assert f"reached\n{min(gi):.0f} % after one epoch against Kaiming's {max(km):.0f} %" in doc


def test_quick_start_page_quotes_the_thread_measurements():
    import bench_threads

    doc = (REPO / "docs" / "quickstart-vision.md").read_text(encoding="utf-8")
    one_line = doc.replace("\n", " ")
    for name in ("threads-quickstart.json", "threads-quickstart-loaded.json"):
        stored = json.loads((REPO / "docs" / name).read_text(encoding="utf-8"))
        assert bench_threads.markdown(stored) in doc and f"]({name})" in doc
        assert stored["command"][:2] == ["python", "scripts/compare_vision.py"]
        flags = stored["command"][2:stored["command"].index("--output-dir")]
        assert f"`gradinit-compare-vision {' '.join(flags)}`" in one_line
        assert min(stored["default_over_one_thread"].values()) > 1  # what the page advises
        loads = [r["load_average_1min_before"] for r in stored["runs"]]
        if name == "threads-quickstart.json":
            assert f"load average of {min(loads):.1f}–{max(loads):.1f} ([{name}]" in one_line
        else:  # the last run's load fell: the page says so
            assert f"load average of {min(loads[:3]):.1f}–{max(loads[:3]):.1f} ([{name}]" in one_line
            assert f"one core busy) had fallen to {loads[3]:.1f}," in one_line


def test_quick_start_page_quotes_the_suite_thread_measurement():
    stored = json.loads((REPO / "docs" / "threads-suite.json").read_text(encoding="utf-8"))
    one_line = (REPO / "docs" / "quickstart-vision.md").read_text(encoding="utf-8").replace("\n", " ")
    s = {(r["omp_num_threads"], r["one_core_busy"]): r["seconds"] for r in stored["runs"]}
    assert (f"{s[(2, False)]:.1f} s with 2 threads and {s[(1, False)]:.1f} s with one; with one core busy, "
            f"{s[(2, True)]:.1f} s with 2 threads and {s[(1, True)]:.1f} s with one") in one_line
    assert all(s[(1, busy)] <= s[(2, busy)] for busy in (False, True))  # what the page advises
    # The record keeps the command as it ran; the page names those files and where they are now.
    for path in stored["command"].split()[-3:]:
        assert f"`{path}`" in one_line
    now = one_line.split(", now ", 1)[1].split(")", 1)[0]
    assert len(re.findall(r"`(tests/[\w/]+\.py)`", now)) == 3
    assert all((REPO / p).is_file() for p in re.findall(r"`(tests/[\w/]+\.py)`", now))


def load_probe_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_probe_under_test", REPO / "scripts" / "demo_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def probe_run():
    """The demo's command path at the probe's tiny size, run once: (the script, its comparison record)."""
    probe = load_probe_script()
    return probe, probe.run_probe()


def test_the_stored_run_has_the_format_of_a_fresh_run(probe_run):
    """Every field of docs/compare-vision.json is still written by the command, with the same type."""
    _, fresh = probe_run
    stored = json.loads((REPO / "docs" / "compare-vision.json").read_text(encoding="utf-8"))

    def missing(a, b, where):
        if isinstance(a, dict):
            if not isinstance(b, dict):
                return [where]
            return [m for k in a for m in (missing(a[k], b[k], f"{where}.{k}") if k in b else [f"{where}.{k}"])]
        if isinstance(a, list) and a and isinstance(b, list) and b:
            return missing(a[0], b[0], f"{where}[0]")
        numbers = (int, float)
        same = isinstance(a, numbers) and isinstance(b, numbers) or a is None or b is None or isinstance(b, type(a))
        return [] if same else [f"{where}: {type(a).__name__} stored, {type(b).__name__} now"]

    assert missing(stored, fresh, "compare") == []
    assert fresh["conditions"]["cpu_capability"] and len(fresh["conditions"]["load_average_1min"]) == 2
    assert fresh["runs"]["gradinit"]["phase"]["iterations"] == 3 and fresh["runs"]["kaiming"]["phase"] is None


def test_the_demo_computes_what_its_stored_run_was_made_with(probe_run):
    """The tripwire of scripts/demo_probe.py: the tiny run's first numbers are the stored probe's, and the probe
    was stored with the run in docs/compare-vision.json."""
    probe, fresh = probe_run
    stored = json.loads(probe.PROBE.read_text(encoding="utf-8"))
    assert stored["argv"] == probe.ARGV
    assert probe.differences(probe.numbers(fresh), stored["runs"], stored["rtol"]) == [], \
        "the demo's code path computes other numbers: rerun the demo, then python scripts/demo_probe.py --write"
    assert stored["stored_sha256"] == probe.sha256(probe.STORED), "run python scripts/demo_probe.py --write"


def test_the_other_cpu_page_quotes_its_measurement():
    doc = " ".join((REPO / "docs" / "quickstart-vision.md").read_text(encoding="utf-8").split())
    other = json.loads((REPO / "docs" / "compare-vision-kaiming-epyc.json").read_text(encoding="utf-8"))
    stored = json.loads((REPO / "docs" / "compare-vision.json").read_text(encoding="utf-8"))
    c = other["conditions"]
    assert other["kaiming_log"]["args"]["init"] == "kaiming" and other["kaiming_log"]["steps_per_epoch"] == 120
    assert (f"The same command on a {c['cpu_count']}-core {c['cpu_model']} ({c['cpu_capability']} kernels, torch "
            f"{c['torch'].split('+')[0]}, one thread) gave {other['kaiming_log']['epochs'][-1]['test_acc']:.1f} % for "
            f"Kaiming's initialization, against {stored['runs']['kaiming']['test_acc']:.1f} % in the stored run") in doc
    first = re.search(r"\|g\|_2 ([\d.]+) \(gamma 1\)", other["gradinit_first_line"]).group(1)
    assert f"(‖g‖₂ {first} at iteration 1)" in doc
    g = stored["runs"]["gradinit"]["gradinit_iterations"]
    assert f"({g['constraint']} constraint and {g['objective']} objective iterations in the stored run)" in doc
    epyc = json.loads((REPO / "docs" / "compare-vision-epyc.json").read_text(encoding="utf-8"))
    e, ge = epyc["runs"], epyc["runs"]["gradinit"]["gradinit_iterations"]
    assert (f"Kaiming {e['kaiming']['test_acc']:.1f} % (the same to the last digit), GradInit "
            f"{e['gradinit']['test_acc']:.1f} % ({ge['objective']} objective and {ge['constraint']} constraint "
            f"iterations, as in the stored run), both runs in {int(epyc['wall_time'] // 60)}m"
            f"{epyc['wall_time'] % 60:.0f}s") in doc
    assert ge == g
    gain = e["gradinit"]["test_acc"] - e["kaiming"]["test_acc"]
    stored_gain = stored["runs"]["gradinit"]["test_acc"] - stored["runs"]["kaiming"]["test_acc"]
    assert f"GradInit is {gain:.1f} points ahead after 120 steps, against {stored_gain:.1f} in the stored run" in doc
    probe = load_probe_script()
    assert probe.RTOL == 1e-3 and "relative tolerance of 1e-3" in doc and "`tests/data/compare-vision-probe.json`" in doc
