"""benchmarks/bench_gpu_phase.py --tiny on a CPU: every field of its JSON and Markdown table."""
import json
import math

import pytest
import torch

pytest.importorskip("fairseq")


def _bench():
    import bench_gpu_phase  # benchmarks/ is on pytest's pythonpath

    return bench_gpu_phase


def _finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def _check_report(report, out, tag, peaks=None):
    assert json.loads((out / f"{tag}.json").read_text()) == json.loads(json.dumps(report))
    assert report["tiny"] and report["settings"]["iters"] == 3
    # Counted FLOPs in units of one forward pass: backward = 2 forwards; an objective iteration is two
    # first-order passes (S and S~, equal size); a constraint iteration is a first-order pass with its graph
    # and the double backward, four forwards where linear uses skip their weight products (six without).
    ratio = report["flops_per_forward"]
    assert ratio["train_update_S"] == pytest.approx(3.0, abs=0.05)
    assert ratio["objective"] == pytest.approx(6.0, abs=0.2)
    assert 6.8 <= ratio["constraint"] <= 8.3
    if peaks is None:
        assert report["peak_tflops"] is None and report["fp16_update"]["floor_s"] is None  # no GPU peak for a CPU
    else:
        assert report["peak_tflops"] == peaks and report["peak_source"] == "--peak-tflops"
        flops = report["flops"]
        assert report["fp16_update"]["floor_s"] == pytest.approx(flops["train_update_S"] / (peaks["fp16"] * 1e12))
        for p, row in report["precisions"].items():
            floor = {b: flops[b] / (peaks[p] * 1e12) for b in ("objective", "constraint")}
            assert row["floor_s"] == pytest.approx(floor)
            assert row["projected_phase_floor_s"] == pytest.approx(780 * (0.3 * floor["objective"]
                                                                          + 0.7 * floor["constraint"]))
    assert _finite(report["fp16_update"]["seconds"]) and report["fp16_update"]["seconds"] > 0
    assert set(report["precisions"]) == {"fp32", "tf32", "bf16"}
    for p, row in report["precisions"].items():
        for key in ("objective_s", "constraint_s", "objective_per_fp16_update", "constraint_per_fp16_update",
                    "projected_phase_s"):
            assert _finite(row[key]) and row[key] > 0, (p, key)
        assert row["projected_phase_s"] == pytest.approx(780 * (0.3 * row["objective_s"] + 0.7 * row["constraint_s"]))
        assert row["objective_per_fp16_update"] == pytest.approx(row["objective_s"] / report["fp16_update"]["seconds"])
        assert row["objective_peak_mib"] is None and row["host_syncs_per_iteration"]["objective"] is None  # CUDA only
        # Reads of tensor values are counted on every device: the engine's one per iteration, and the
        # model's own (fairseq reads shapes and padding flags) in each pass: two passes for an objective
        # iteration, one for a constraint iteration that reuses the graph.
        reads = row["host_reads_per_iteration"]
        assert reads["objective"] - 1 == 2 * (reads["constraint"] - 1) and reads["constraint"] >= 1
        for branch, prof in row["profile_per_iteration"].items():
            assert prof["aten_ops"] > 0 and prof["gpu_busy_ms"] is None and prof["launches"] is None
            # the scale bookkeeping works on flat buffers: no product per parameter tensor; a constraint
            # iteration takes at most three dots per recorded linear use (<a_Y, Y>, its bias, <a_dX, dX>)
            if branch == "objective":
                assert prof["aten_dot"] == 0, (p, branch, prof)
            else:
                assert 0 < prof["aten_dot"] <= 3 * report["tensors"], (p, branch, prof)
        assert ("floor_s" in row) == (peaks is not None)
        diffs = row["max_rel_scale_diff_vs_fp32"]
        assert all(_finite(d) for d in diffs.values())
    assert report["precisions"]["fp32"]["max_rel_scale_diff_vs_fp32"] == {"objective": 0.0, "constraint": 0.0}
    # TF32 touches CUDA arithmetic only; bf16 autocast runs on the CPU and changes the scales a little.
    assert report["precisions"]["tf32"]["max_rel_scale_diff_vs_fp32"] == {"objective": 0.0, "constraint": 0.0}
    assert 0 < max(report["precisions"]["bf16"]["max_rel_scale_diff_vs_fp32"].values()) < 0.1
    assert any("on a CPU it runs as fp32" in n for n in report["notes"])
    md = (out / f"{tag}.md").read_text()
    assert md.count("\n| fp32 |") == md.count("\n| tf32 |") == md.count("\n| bf16 |") == 1
    assert "780-iteration phase" in md and "Counted FLOPs" in md
    fp16 = report["fp16_update"]["profile"]
    assert fp16["aten_ops"] > 0 and fp16["gpu_busy_ms"] is None
    assert report["settings"]["cudnn_sdpa"] in ("on", "off") and report["tensors"] > 0


def test_tiny_benchmark_on_synthetic_tokens(tmp_path):
    bench = _bench()
    args = bench.get_args_parser().parse_args(["--tiny", "--device", "cpu", "--out", str(tmp_path),
                                               "--cudnn-sdpa", "off"])
    before = torch.backends.cuda.cudnn_sdp_enabled()
    report = bench.main(args)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before  # set for the run only
    _check_report(report, tmp_path, "gpu_phase_cpu_tiny")
    assert report["data"]["source"] == "synthetic" and report["settings"]["cudnn_sdpa"] == "off"


def test_tiny_benchmark_on_a_data_bin(tmp_path):
    from fairseq_helpers import make_tiny_bin

    data = make_tiny_bin(tmp_path, {"train": 300, "valid": 40, "test": 40}, nwords=200)
    bench = _bench()
    args = bench.get_args_parser().parse_args(["--tiny", "--device", "cpu", "--data-bin", str(data),
                                               "--out", str(tmp_path / "out"), "--tag", "bin",
                                               "--peak-tflops", "fp32=67,tf32=494.7,bf16=989.4,fp16=989.4"])
    report = bench.main(args)
    _check_report(report, tmp_path / "out", "bin", peaks={"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4})
    assert report["data"]["source"] == str(data) and report["data"]["tokens_per_draw"] == 144


@pytest.mark.parametrize("argv, message", [
    (["--precisions", "fp8"], "--precisions fp8"),
    (["--peak-tflops", "fp32=67"], "--peak-tflops 'fp32=67': give a number > 0 for each"),
    (["--peak-tflops", "fp32=fast"], "--peak-tflops 'fp32=fast'"),
    (["--profile-iters", "0"], "--profile-iters 0: give 1 to --iters"),
])
def test_bad_arguments_are_usage_errors(tmp_path, capsys, argv, message):
    bench = _bench()
    args = bench.get_args_parser().parse_args(["--tiny", "--out", str(tmp_path), *argv])
    with pytest.raises(SystemExit) as e:
        bench.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any work
