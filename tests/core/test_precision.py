"""GradInitConfig.precision: TF32 settings held only during iterations, bf16 autocast in every loss
pass with fp32 scales, and bf16 scales close to fp32 ones (CPU)."""
import math

import pytest
import torch

from fairseq_gradinit.core import BatchPair, GradInit, GradInitConfig, gradinit, gradinit_mode
from fairseq_gradinit.core import engine as engine_module
from fairseq_gradinit.core.precision import loss_in_precision, phase_precision, tf32_matmuls
from tiny_models import TinyTransformer, lm_loss, token_batches


def tf32_state():
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision") and hasattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision"):
        return (m.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    return (m.allow_tf32, torch.backends.cudnn.allow_tf32)


TF32_ON = {("tf32", "tf32"), (True, True)}


@pytest.mark.parametrize("branch_gamma", [1e-3, 1e9])  # constraint, objective
def test_tf32_settings_hold_inside_loss_passes_and_are_restored(branch_gamma):
    before = tf32_state()
    if before in TF32_ON:
        pytest.skip("TF32 already enabled in this process")
    seen = []

    def loss_fn(model, batch):
        seen.append(tf32_state())
        return lm_loss(model, batch)

    torch.manual_seed(0)
    res = gradinit(TinyTransformer(), token_batches(3), loss_fn,
                   GradInitConfig(eta=1e-3, gamma=branch_gamma, iters=2, precision="tf32"))
    assert res.num_skipped == 0 and len(seen) >= 3
    assert set(seen) <= TF32_ON
    assert tf32_state() == before


def test_tf32_settings_restored_when_an_iteration_raises():
    before = tf32_state()
    calls = []

    def failing(model, batch):
        calls.append(tf32_state())
        raise RuntimeError("boom")

    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="boom"):
        gradinit(TinyTransformer(), token_batches(3), failing, GradInitConfig(iters=2, precision="tf32"))
    assert calls and set(calls) <= TF32_ON
    assert tf32_state() == before
    with pytest.raises(KeyError):
        with phase_precision("tf32"):
            raise KeyError("x")
    assert tf32_state() == before
    with tf32_matmuls():
        assert tf32_state() in TF32_ON
    assert tf32_state() == before


def test_fp32_and_bf16_leave_tf32_settings_alone():
    before = tf32_state()
    for precision in ("fp32", "bf16"):
        with phase_precision(precision):
            assert tf32_state() == before


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_loss_passes_run_without_cudnn_attention_and_the_setting_is_restored(precision):
    """cuDNN attention plans every new shape anew; GradInit's passes use the other SDPA kernels."""
    if not hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        pytest.skip("this torch has no cuDNN attention")
    seen = []

    def loss_fn(model, batch):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return lm_loss(model, batch)

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        for enabled in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(enabled)
            torch.manual_seed(0)
            gradinit(TinyTransformer(), token_batches(3), loss_fn, GradInitConfig(eta=1e-3, iters=2, precision=precision))
            assert torch.backends.cuda.cudnn_sdp_enabled() == enabled
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
    assert len(seen) >= 6 and not any(seen)


@pytest.mark.parametrize("gamma", [1e-3, 1e9])  # every iteration constraint / objective
def test_bf16_autocast_in_every_loss_pass_and_scales_stay_fp32(gamma, monkeypatch):
    calls = []

    def loss_fn(model, batch):
        calls.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return lm_loss(model, batch)

    torch.manual_seed(0)
    model = TinyTransformer()
    engine = GradInit(model, loss_fn, GradInitConfig(eta=1e-3, gamma=gamma, lr=2.5e-3, precision="bf16"))
    norm_inputs = []
    grad_norm = engine_module.grad_norm  # the step's ||g||, which gradinit_step calls
    monkeypatch.setattr(engine_module, "grad_norm", lambda grads, p: norm_inputs.append({g.dtype for g in grads})
                        or grad_norm(grads, p))
    batches = token_batches(4)
    with gradinit_mode(model):
        for i in range(3):
            rec = engine.step(BatchPair(batches[i], batches[i + 1]))
            assert rec.branch == ("constraint" if gamma < 1 else "objective")
    engine.finalize()
    # constraint: S twice on the first iteration, then once (graph reuse); objective: S and S~
    assert len(calls) == (4 if gamma < 1 else 6)
    assert all(c == (True, torch.bfloat16) for c in calls)
    assert not torch.is_autocast_enabled("cpu")  # nothing leaks out of the loss passes
    assert norm_inputs and all(d == {torch.float32} for d in norm_inputs)
    adam = engine.state.adam_constraint if gamma < 1 else engine.state.adam
    for t in (engine.state.alpha, adam.m, adam.v, engine.target.scaled.min_scales):
        assert t.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    alpha = engine.state.alpha
    assert torch.isfinite(alpha).all() and not torch.equal(alpha, torch.ones_like(alpha))
    assert all(isinstance(r.loss_s, float) and math.isfinite(r.loss_s) for r in engine.history)


#: Largest relative difference of a bf16 run's scales from the fp32 run's (same seed and batches,
#: 6 iterations of Adam at lr 2.5e-3, which move the scales by up to 1.5e-2). Measured: 7e-5 (objective)
#: and 2.3e-4 (constraint).
BF16_TOLERANCE = 2e-3


@pytest.mark.parametrize("gamma", [1e-3, 1e9])
def test_bf16_scales_close_to_fp32(gamma):
    def run(precision):
        torch.manual_seed(0)
        return gradinit(TinyTransformer(), token_batches(7), lm_loss,
                        GradInitConfig(eta=1e-3, gamma=gamma, lr=2.5e-3, iters=6, precision=precision))

    ref, low = run("fp32"), run("bf16")
    assert [r.branch for r in low.history] == [r.branch for r in ref.history]
    assert all(math.isfinite(v) for v in low.scales.values())
    rel = max(abs(low.scales[k] - ref.scales[k]) / abs(ref.scales[k]) for k in ref.scales)
    moved = max(abs(v - 1.0) for v in ref.scales.values())
    assert 0 < rel <= BF16_TOLERANCE, rel  # > 0: the bf16 passes did run in bf16
    assert moved > 5 * BF16_TOLERANCE  # the tolerance is small against how far the scales move


def test_bf16_loss_is_returned_in_fp32_and_other_precisions_keep_the_loss_fn():
    torch.manual_seed(0)
    model = TinyTransformer()
    batch = token_batches(1)[0]
    assert loss_in_precision(lm_loss, "fp32", "cpu") is lm_loss
    assert loss_in_precision(lm_loss, "tf32", "cpu") is lm_loss
    assert loss_in_precision(lambda m, b: model(b).sum().bfloat16(), "bf16", "cpu")(model, batch).dtype == torch.float32
    with pytest.raises(ValueError, match="expected one of"):
        loss_in_precision(lm_loss, "fp16", "cpu")


@pytest.mark.parametrize("kwargs, match", [
    (dict(precision="fp16"), r"precision='fp16' is invalid: expected one of \('fp32', 'tf32', 'bf16'\)"),
    (dict(precision="bf16", constraint_grad="finite_difference"), "constraint_grad='exact'"),
    (dict(precision="tf32", constraint_grad="finite_difference"), "constraint_grad='exact'"),
])
def test_invalid_precision_settings_say_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GradInitConfig(**kwargs)


def test_precision_offered_by_every_front_end():
    import inspect

    from fairseq_gradinit.core.options import result_options
    from fairseq_gradinit.vision import gradinit as vision_gradinit

    assert "precision" in result_options()  # it changes the learned scales: fingerprints compare it
    assert inspect.signature(vision_gradinit).parameters["precision"].default == "fp32"
    from fairseq_gradinit.fairseq_plugin.settings.option_values import gradinit_config_from_task
    from fairseq_gradinit.fairseq_plugin.settings.options import GradInitOptions

    assert GradInitOptions().gradinit_precision == "fp32"
    opts = GradInitOptions(gradinit_precision="bf16", gradinit_train_lr=[5e-4], gradinit_train_optimizer="adam",
                           gradinit_iters=3, gradinit_train_max_tokens=1000)
    assert gradinit_config_from_task(opts).precision == "bf16"

    from fairseq_gradinit.core.options import values_from
    from fairseq_gradinit.tools.train_vision import cli as tv

    args = tv.get_args_parser().parse_args(["--gradinit-precision", "tf32"])
    assert values_from(args, tv.GRADINIT_CLI_OPTIONS, prefix="gradinit_")["precision"] == "tf32"
