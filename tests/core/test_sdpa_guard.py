"""The cuDNN attention guard: its decision on faked versions and GPUs, its one log line, the opt-out,
and its wiring into fairseq-train (gradinit.json, monitor.jsonl)."""
import json
import logging

import pytest
import torch

from fairseq_gradinit.core import sdpa_guard
from fairseq_gradinit.core.sdpa_guard import SdpaEnvironment, decide, guard_cudnn_sdpa, probe_kernel

AFFECTED = dict(torch_version="2.11.0+cu130", cudnn_version=92000, capability=(9, 0), cudnn_sdp_enabled=True)


@pytest.fixture(autouse=True)
def cudnn_sdp_restored():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def env(**changes):
    return SdpaEnvironment(**{**AFFECTED, **changes})


def no_probe():
    raise AssertionError("the kernel is tested only when the versions cannot tell")


def guard_lines(caplog):
    return [r for r in caplog.records if r.name == sdpa_guard.__name__]


@pytest.mark.parametrize("precision", ["fp16", "bf16", "amp"])
def test_an_affected_torch_turns_cudnn_attention_off_with_one_log_line(caplog, precision):
    caplog.set_level(logging.INFO)
    decision = guard_cudnn_sdpa("auto", precision=precision, env=env(), probe=no_probe, opt_out="--the-flag off")
    assert decision.affected is True and decision.action == "disabled"
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    lines = guard_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "2.11.0+cu130" in lines[0].getMessage() and "--the-flag off" in lines[0].getMessage()
    assert decision.to_dict()["environment"]["capability"] == (9, 0)


@pytest.mark.parametrize("changes, precision, why", [
    ({}, "fp32", "fp32 training"),
    ({"torch_version": "2.10.1"}, "fp16", "predates"),
    ({"cudnn_version": 92600}, "fp16", "has the fix"),
    ({"capability": (8, 0)}, "fp16", "compute capability 8.0"),
    ({"capability": (10, 0)}, "bf16", "compute capability 10.0"),
    ({"capability": None}, "fp16", "not a CUDA device"),
    ({"cudnn_version": None}, "fp16", "no cuDNN"),
])
def test_an_unaffected_combination_is_left_alone(caplog, changes, precision, why):
    caplog.set_level(logging.INFO)
    decision = guard_cudnn_sdpa("auto", precision=precision, env=env(**changes), probe=no_probe)
    assert decision.affected is False and decision.action == "kept" and why in decision.reason
    assert torch.backends.cuda.cudnn_sdp_enabled()
    assert guard_lines(caplog) == []


def test_opting_out_keeps_cudnn_attention_and_says_it_is_affected(caplog):
    caplog.set_level(logging.INFO)
    decision = guard_cudnn_sdpa("off", precision="fp16", env=env(), probe=no_probe)
    assert decision.action == "kept" and decision.affected is True
    assert torch.backends.cuda.cudnn_sdp_enabled()
    assert len(guard_lines(caplog)) == 1 and "kept although it is affected" in guard_lines(caplog)[0].getMessage()


def test_on_turns_it_off_anywhere_and_an_already_off_flag_is_not_logged(caplog):
    caplog.set_level(logging.INFO)
    decision = guard_cudnn_sdpa("on", precision="fp32", env=env(capability=None), probe=no_probe)
    assert decision.action == "disabled" and not torch.backends.cuda.cudnn_sdp_enabled()
    assert len(guard_lines(caplog)) == 1
    again = guard_cudnn_sdpa("auto", precision="fp16", env=env(cudnn_sdp_enabled=False), probe=no_probe)
    assert again.action == "already off" and len(guard_lines(caplog)) == 1


@pytest.mark.parametrize("result, disabled", [({"nonfinite_grad_q": 12288}, True), ({"nonfinite_grad_q": 0}, False),
                                              ({"unavailable": "No available kernel"}, False)])
def test_a_later_torch_with_an_old_cudnn_is_decided_by_one_test_of_the_kernel(result, disabled):
    calls = []

    def probe():
        calls.append(1)
        return result

    decision = decide("auto", precision="fp16", env=env(torch_version="2.14.1+cu130", cudnn_version=92400), probe=probe)
    assert calls == [1] and decision.probe == result
    assert decision.affected is disabled and decision.action == ("disabled" if disabled else "kept")


def test_bad_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, on, off"):
        decide("disable", precision="fp16", env=env())


def test_the_kernel_test_reports_no_cudnn_kernel_on_a_cpu():
    assert "unavailable" in probe_kernel(torch.float32, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_kernel_test_runs_on_this_gpu():
    result = probe_kernel(torch.float16, torch.device("cuda"))
    assert set(result) <= {"nonfinite_grad_q", "unavailable"} and result


# ---- fairseq ---------------------------------------------------------------------------------------
def test_fp16_fairseq_config_on_an_affected_gpu_is_guarded(monkeypatch, caplog):
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.features import sdpa
    from fairseq_gradinit.fairseq_plugin.settings.options import GradInitOptions
    from fairseq_gradinit.fairseq_plugin.settings.plan import RunPlan, build_plan

    def plan(**settings):  # fairseq's globals unset: interpolations no config resolves
        return build_plan(GradInitOptions(**settings))

    monkeypatch.setattr(RunPlan, "device", lambda self: torch.device("cuda", 0))
    monkeypatch.setattr(SdpaEnvironment, "detect", classmethod(lambda cls, device=None: env()))
    caplog.set_level(logging.INFO)
    decision = sdpa.guard_from_plan(plan(gradinit_cudnn_sdpa_guard="auto", gradinit_fp16=True, gradinit_cpu=False))
    assert decision.action == "disabled" and decision.precision == "fp16"
    assert "--gradinit-cudnn-sdpa-guard off" in guard_lines(caplog)[0].getMessage()
    assert sdpa.training_precision(plan(gradinit_bf16=True)) == "bf16"
    assert sdpa.training_precision(plan(gradinit_amp=True)) == "amp"
    assert sdpa.training_precision(plan(gradinit_iters=5, gradinit_precision="bf16")) == "bf16"
    assert sdpa.training_precision(plan(gradinit_fp16="${common.fp16}")) == "fp32"  # not resolvable: not set


def test_fairseq_train_records_the_guard_in_gradinit_json_and_monitor_jsonl(tmp_path, caplog):
    pytest.importorskip("fairseq")
    from fairseq_helpers import make_tiny_bin
    from fairseq_train import TINY_MODEL, train_inprocess

    data = make_tiny_bin(tmp_path, {"train": 120, "valid": 20, "test": 20}, 300)
    save = tmp_path / "ck"
    caplog.set_level(logging.INFO)
    train_inprocess([str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
                     "--save-dir", str(save), "--gradinit-iters", "2", "--gradinit-monitor-interval", "1",
                     "--gradinit-cudnn-sdpa-guard", "on"])
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    recorded = json.loads((save / "gradinit.json").read_text())["cudnn_sdpa_guard"]
    assert recorded["mode"] == "on" and recorded["action"] == "disabled" and recorded["precision"] == "fp32"
    start = json.loads((save / "monitor.jsonl").read_text().splitlines()[0])
    assert start["type"] == "start" and start["cudnn_sdpa_guard"] == recorded
    assert len(guard_lines(caplog)) == 1


def test_the_vision_api_offers_the_guard(caplog):
    from fairseq_gradinit.vision import guard_cudnn_sdpa as vision_guard

    caplog.set_level(logging.INFO)
    decision = vision_guard("auto", precision="amp", env=env(), probe=no_probe)
    assert decision.action == "disabled" and not torch.backends.cuda.cudnn_sdp_enabled()
    assert "mode='off'" in guard_lines(caplog)[0].getMessage()


def test_the_speed_benchmark_runs_both_settings_in_fresh_workers(tmp_path):
    """benchmarks/bench_sdpa_guard.py at a tiny size on the CPU (where the flag changes no kernel): the
    JSON holds both settings, two passes over every shape, and the ratios."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("fairseq")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sdpa_guard.py"
    subprocess.run([sys.executable, str(script), "--device", "cpu", "--max-tokens", "48", "--lengths", "5,8",
                    "--layers", "1", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--vocab", "40",
                    "--out", str(tmp_path), "--tag", "t"], check=True, capture_output=True, timeout=600)
    report = json.loads((tmp_path / "t.json").read_text())
    for setting in ("cudnn_on", "cudnn_off"):
        passes = report["results"][setting]["passes"]
        assert len(passes) == 2 and all(len(p["ms"]) == 2 and p["nonfinite_steps"] == 0 for p in passes)
    assert report["ratio_off_over_on_first_pass"] > 0 and report["ratio_off_over_on_second_pass"] > 0
    assert (tmp_path / "t.md").read_text().count("| cudnn_") == 2


def test_detect_reads_this_process(monkeypatch):
    found = SdpaEnvironment.detect(torch.device("cpu"))
    assert found.torch_version == torch.__version__ and found.capability is None
    assert found.cudnn_sdp_enabled is torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    assert SdpaEnvironment.detect(None).cudnn_version is None  # a ROCm build has no cuDNN attention


def test_the_kernel_test_through_torchs_own_dispatch_is_finite_on_a_cpu():
    assert probe_kernel(torch.float32, torch.device("cpu"), cudnn_only=False) == {"nonfinite_grad_q": 0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_after_the_guard_this_gpu_gives_finite_query_gradients_on_the_faulty_case(dtype):
    precision = "fp16" if dtype == torch.float16 else "bf16"
    decision = guard_cudnn_sdpa("auto", precision=precision, device=torch.device("cuda"))
    result = probe_kernel(dtype, torch.device("cuda"), cudnn_only=False)
    assert result == {"nonfinite_grad_q": 0}, (decision.to_dict(), result)
