"""The fingerprint that decides whether a saved GradInit result is reused covers every setting of the plan
that changes GradInit's batches or arithmetic: each option declared as changing the result, and fairseq's
own settings the plan reads for the batches (``RESULT_GLOBAL_SETTINGS``, ``--batch-size``). A new such
setting without a case here fails the test. docs/reliability.md ("Results that are not what was asked")."""
import pytest

pytest.importorskip("fairseq")

from fairseq_gradinit.fairseq_plugin.phase import provenance  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import (  # noqa: E402
    ENGINE_OPTIONS,
    RESULT_GLOBAL_SETTINGS,
    plugin_result_options,
)
from fairseq_train import TINY_MODEL  # noqa: E402

#: A changed value of each setting (the base run leaves each at its default, or at the value named).
CHANGED = {
    "gradinit_optimizer": ["--gradinit-optimizer", "sgd"],
    "gradinit_eta": ["--gradinit-eta", "0.003"],
    "gradinit_gamma": ["--gradinit-gamma", "3"],
    "gradinit_lr": ["--gradinit-lr", "0.001"],
    "gradinit_betas": ["--gradinit-betas", "(0.8, 0.9)"],
    "gradinit_eps": ["--gradinit-eps", "1e-6"],
    "gradinit_iters": ["--gradinit-iters", "3"],
    "gradinit_min_scale": ["--gradinit-min-scale", "0.02"],
    "gradinit_max_scale": ["--gradinit-max-scale", "50"],
    "gradinit_gamma_init_factor": ["--gradinit-gamma-init-factor", "3"],
    "gradinit_overlap": ["--gradinit-overlap", "0.25"],
    "gradinit_pairs": ["--gradinit-pairs", "authors"],
    "gradinit_adam_state": ["--gradinit-adam-state", "shared"],
    "gradinit_scale_grad_clip": ["--gradinit-scale-grad-clip", "1"],
    "gradinit_sgd_step": ["--gradinit-sgd-step", "normalized"],
    "gradinit_constraint_grad": ["--gradinit-constraint-grad", "finite_difference"],
    "gradinit_fd_eps": ["--gradinit-fd-eps", "0.001"],
    "gradinit_scale_bounds": ["--gradinit-scale-bounds", "[]"],
    "gradinit_step_params": ["--gradinit-step-params", "scaled"],
    "gradinit_max_step_ratio": ["--gradinit-max-step-ratio", "0.5"],
    "gradinit_dropout": ["--gradinit-dropout", "true"],
    "gradinit_lookahead_steps": ["--gradinit-lookahead-steps", "2"],
    "gradinit_lookahead_betas": ["--gradinit-lookahead-betas", "(0.8, 0.9)"],
    "gradinit_loss_ceiling": ["--gradinit-loss-ceiling", "0.5"],
    "gradinit_unstepped_uses": ["--gradinit-unstepped-uses", "decoder\\.output_projection\\."],
    "gradinit_precision": ["--gradinit-precision", "tf32"],
    "gradinit_max_tokens": ["--gradinit-max-tokens", "300"],
    "gradinit_tied_embeddings": ["--gradinit-tied-embeddings", "per-use"],
    "gradinit_source_contrast": ["--gradinit-source-contrast", "2"],
    "gradinit_source_margin": ["--gradinit-source-contrast", "2", "--gradinit-source-margin", "1"],
    # before: not in the fingerprint, so a result drawn from other batches was reused as matching
    "gradinit_train_batch_size": ["--batch-size", "4"],
}


def test_changing_any_setting_that_changes_gradinits_batches_or_arithmetic_changes_the_fingerprint(tiny_data,
                                                                                                      tmp_path):
    settings = ["gradinit_" + s.name for s in ENGINE_OPTIONS if s.result] + list(plugin_result_options()) + \
        list(RESULT_GLOBAL_SETTINGS)
    assert "gradinit_train_batch_size" in settings
    assert sorted(set(settings) - set(CHANGED)) == []  # a new setting needs its case here
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--save-dir", str(tmp_path / "a"), "--gradinit-iters", "2", "--share-decoder-input-output-embed"]
    base = provenance.fingerprint_from_args(argv)
    unchanged = []
    for name in settings:
        diff = provenance.fingerprint_diff(base, provenance.fingerprint_from_args(argv + CHANGED[name]))
        if not diff or not all(d.startswith("gradinit.") for d in diff):
            unchanged.append((name, diff))
    assert unchanged == []
    # the same --batch-size given twice, and a run without one, keep their fingerprints
    with_batch = provenance.fingerprint_from_args(argv + ["--batch-size", "4"])
    assert provenance.fingerprint_diff(with_batch, provenance.fingerprint_from_args(argv + ["--batch-size", "4"])) == []
    assert "gradinit_train_batch_size" not in base["gradinit"]["plugin"]
