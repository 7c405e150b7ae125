"""scripts/gpu_checks.py, the GPU checks as one command: without CUDA it runs both benchmarks' tiny CPU
path and packs their results into one archive."""
import importlib.util
import json
import tarfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_checks_under_test", REPO / "scripts" / "gpu_checks.py")
gpu_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_checks)


def test_without_cuda_both_benchmarks_run_tiny_and_one_archive_holds_them(tmp_path):
    argv = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")]
    if torch.cuda.is_available():  # the CPU path, as on a machine without CUDA
        argv.append("--tiny")
    assert gpu_checks.main(argv) == 0
    archive = tmp_path / "out" / gpu_checks.ARCHIVE
    assert [p.name for p in (tmp_path / "out").iterdir()] == [archive.name]
    with tarfile.open(archive) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert {"manifest.json", "phase_e2e.log", "gpu_phase.log", "phase_e2e_cpu_tiny.json", "phase_e2e_cpu_tiny.md",
            "gpu_phase_cpu_tiny.json", "gpu_phase_cpu_tiny.md"} <= set(files)
    manifest = json.loads(files["manifest.json"])
    assert manifest["cuda"] is False and manifest["device"] == "cpu (tiny)"
    assert [s["name"] for s in manifest["steps"]] == ["phase_e2e", "gpu_phase"]
    for step in manifest["steps"]:
        assert step["returncode"] == 0 and "--tiny" in step["argv"] and "--device" in step["argv"]
        assert step["argv"][step["argv"].index("--device") + 1] == "cpu"
    assert json.loads(files["phase_e2e_cpu_tiny.json"])["tiny"] is True
    assert json.loads(files["gpu_phase_cpu_tiny.json"])["tiny"] is True


def test_on_cuda_the_plan_is_the_d512_model_within_the_budget(tmp_path):
    args = gpu_checks.get_args_parser().parse_args(["--out", str(tmp_path)])
    steps = gpu_checks.plan(args, tmp_path / "results", tmp_path, cuda=True)
    e2e, phase = (s["argv"] for s in steps)
    assert e2e[e2e.index("--embed-dim") + 1] == "512" and e2e[e2e.index("--ffn-dim") + 1] == "1024"
    assert e2e[e2e.index("--device") + 1] == "cuda" and phase[phase.index("--device") + 1] == "cuda"
    assert "--tiny" not in e2e + phase
    assert sum(s["share"] for s in steps) == pytest.approx(1.0)
    assert args.budget <= 9 * 60


def test_a_bad_budget_is_a_usage_error(tmp_path, capsys):
    assert gpu_checks.main(["--out", str(tmp_path / "out"), "--budget", "0"]) == 2
    assert "--budget 0" in capsys.readouterr().err and not (tmp_path / "out").exists()
