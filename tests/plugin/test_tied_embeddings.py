"""--gradinit-tied-embeddings per-use: one GradInit scale per use of a tied embedding matrix."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("fairseq")

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (registers the tasks)
from fairseq_gradinit.fairseq_plugin.data.training import build_training_model  # noqa: E402
from fairseq_gradinit.fairseq_plugin.features.tied import (  # noqa: E402
    effective_use_scales, install_multipliers, multiplier_names, multipliers_as_parameters,
)
from fairseq_helpers import REPO, make_tiny_bin  # noqa: E402
from fairseq_train import TINY_TIED_MODEL as MODEL  # noqa: E402




@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_tiny_bin(tmp_path_factory.mktemp("tied"), {"train": 300, "valid": 40, "test": 40}, nwords=200)


def _model(tiny_data, *extra):
    fm = build_training_model([str(tiny_data), "--task", "translation_gradinit", *MODEL, *extra])
    fm.model.double().eval()
    return fm


def _sample(fm):
    from fairseq_gradinit.fairseq_plugin.data.training import collate, training_dataset

    dataset = training_dataset(fm.task)
    return collate(dataset, list(range(8)), fm.device)


def _loss(fm, sample):
    """Mean token NLL in the model's precision (fairseq's criterion takes log-softmax in float32)."""
    logits = fm.model(**sample["net_input"])[0]
    target = sample["target"]
    keep = target.ne(fm.task.target_dictionary.pad())
    lprobs = torch.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return -(lprobs * keep).sum() / keep.sum()


@pytest.mark.parametrize("share", ["--share-all-embeddings", "--share-decoder-input-output-embed"])
def test_multipliers_keep_the_function_and_their_gradients_are_exact(tiny_data, share):
    fm = _model(tiny_data, share)
    sample = _sample(fm)
    with torch.no_grad():
        before = _loss(fm, sample)
    names = install_multipliers(fm.model)
    expected = ["encoder.embed_scale", "decoder.embed_scale"] if "all" in share else ["decoder.embed_scale"]
    assert names == expected and multiplier_names(fm.model) == expected
    with torch.no_grad():
        assert torch.equal(_loss(fm, sample), before)  # same function
    weight = fm.model.decoder.embed_tokens.weight
    # GradInit's gradient of each use's scale (d L / d alpha = <dL/dm, m>) against finite differences
    with multipliers_as_parameters(fm.model, names):
        params = dict(fm.model.named_parameters())
        loss = _loss(fm, sample)
        grads = torch.autograd.grad(loss, [params[n] for n in names] + [weight])
    buffers = dict(fm.model.named_buffers())
    per_use = {n: float((g * buffers[n]).sum()) for n, g in zip(names, grads)}
    own = float((grads[-1] * weight).sum())
    # fairseq takes attention softmaxes in float32 even in a float64 model: steps below ~1e-4 see that
    # rounding, steps above ~1e-2 the curvature; at 1e-3 the central difference is within ~1e-4.
    h = 1e-3

    def loss_at(mult=None, factor=1.0, output_only=False):
        with torch.no_grad():
            saved_w = weight.detach().clone()
            saved = {n: b.clone() for n, b in fm.model.named_buffers() if n in names}
            bufs = dict(fm.model.named_buffers())
            if output_only:  # scale only the output projection's use: W * f, every input multiplier / f
                weight.mul_(factor)
                for n in names:
                    bufs[n].div_(factor)
            else:
                bufs[mult].mul_(factor)
            value = float(_loss(fm, sample))
            weight.copy_(saved_w)
            for n, v in saved.items():
                bufs[n].copy_(v)
            return value

    for n in names:
        numeric = (loss_at(n, 1 + h) - loss_at(n, 1 - h)) / (2 * h)
        assert abs(numeric - per_use[n]) < 2e-3 * max(0.01, abs(numeric)), (n, numeric, per_use[n])
    output_use = (loss_at(factor=1 + h, output_only=True) - loss_at(factor=1 - h, output_only=True)) / (2 * h)
    # the tensor's own scale moves every use: its gradient is the sum of the uses' gradients
    assert abs(own - (output_use + sum(per_use.values()))) < 2e-3 * max(0.01, abs(own)), (own, output_use, per_use)


def test_shared_mode_and_untied_models_get_no_multiplier(tiny_data):
    assert install_multipliers(_model(tiny_data).model) == []  # nothing tied
    fm = _model(tiny_data, "--share-all-embeddings")
    assert "encoder.embed_scale" not in fm.model.state_dict()  # the default 'shared' installs nothing


def _train(argv, cwd):
    # a fatal signal prints every thread's Python stack (in the assertion's stderr tail)
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-m", "fairseq_cli.train", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def test_per_use_end_to_end_resume_and_reload(tiny_data, tmp_path):
    """fairseq-train with per-use scales: gradinit.json names each use, the checkpoint holds the
    multipliers, the reloaded model computes exactly the GradInit function (lr 0 keeps the start
    weights), resume skips GradInit, and an init file re-applies the scales exactly."""
    save = tmp_path / "ck"
    common = [str(tiny_data), "--task", "translation_gradinit", *MODEL, "--share-all-embeddings",
              "--user-dir", str(REPO / "fairseq_gradinit"), "--gradinit-tied-embeddings", "per-use"]
    out = _train(common + ["--lr", "0", "--gradinit-eta", "1e-3", "--max-update", "1", "--save-dir", str(save),
                          "--gradinit-iters", "3"], REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads((save / "gradinit.json").read_text())
    assert {"encoder.embed_scale", "decoder.embed_scale", "encoder.embed_tokens.weight"} <= set(info["scales"])
    assert set(info["uses"]) == {"encoder.embed_tokens", "decoder.embed_tokens", "decoder.output_projection"}
    own = info["scales"]["encoder.embed_tokens.weight"]
    assert info["uses"]["decoder.output_projection"] == own
    assert abs(info["uses"]["encoder.embed_tokens"] - own * info["scales"]["encoder.embed_scale"]) < 1e-12
    assert info["config"]["fixed_params"] == "is_multiplier"
    assert info["health"]["verdict"] in ("ok", "degenerate") and info["health"]["norms"]  # measured with the multipliers
    assert info["fingerprint"]["gradinit"]["plugin"]["gradinit_tied_embeddings"] == "per-use"

    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    loaded = models[0].eval()
    assert "encoder.embed_scale" in loaded.state_dict() and "decoder.embed_scale" in loaded.state_dict()
    fm = build_training_model([str(tiny_data), "--task", "translation_gradinit", *MODEL, "--share-all-embeddings",
                               "--gradinit-tied-embeddings", "per-use", "--gradinit-init-file",
                               str(save / "gradinit.json")], gradinit=True)
    fm.model.eval()
    sample = _sample(fm)
    with torch.no_grad():
        a = loaded(**sample["net_input"])[0]
        b = fm.model(**sample["net_input"])[0]
    assert torch.equal(a, b)  # reloaded checkpoint == fresh model + init file == the GradInit function
    # fairseq-generate (and so scripts/evaluate_bleu.py) loads with its own command line's task, where the
    # flag has its default: the multipliers are installed from the checkpoint's state all the same
    from fairseq import tasks

    from fairseq_gradinit.fairseq_plugin.data.training import training_config

    cli_task = tasks.setup_task(training_config([str(tiny_data), "--task", "translation_gradinit", *MODEL]).task)
    generate_models, _ = checkpoint_utils.load_model_ensemble([str(save / "checkpoint_last.pt")], task=cli_task)
    with torch.no_grad():
        assert torch.equal(generate_models[0].eval()(**sample["net_input"])[0], a)
    mult = float(fm.model.encoder.embed_scale)
    assert abs(mult - 4.0 * info["scales"]["encoder.embed_scale"]) < 1e-5  # sqrt(16) x the use's scale

    # scripts/evaluate_bleu.py (fairseq-generate) translates the per-use checkpoint
    bleu_json = tmp_path / "bleu.json"
    scored = subprocess.run([sys.executable, str(REPO / "scripts" / "evaluate_bleu.py"), str(tiny_data), "--path",
                             str(save / "checkpoint_last.pt"), "--user-dir", "fairseq_gradinit", "--cpu", "--beam", "1",
                             "--output-json", str(bleu_json), "--", "--max-len-a", "1.2", "--max-len-b", "10"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(bleu_json.read_text())["bleu"] is not None

    resumed = _train(common + ["--lr", "1e-3", "--max-update", "2", "--save-dir", str(save), "--gradinit-iters", "3"],
                     REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not running GradInit" in resumed.stdout + resumed.stderr

    # an init file with per-use scales needs the flag
    refused = _train([a for a in common if a not in ("--gradinit-tied-embeddings", "per-use")]
                     + ["--max-update", "1", "--save-dir", str(tmp_path / "x"), "--gradinit-init-file",
                        str(save / "gradinit.json")], REPO)
    assert refused.returncode != 0 and "--gradinit-tied-embeddings per-use" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_effective_use_scales_of_a_shared_run(tiny_data):
    fm = _model(tiny_data, "--share-all-embeddings")
    uses = effective_use_scales(fm.model, {"encoder.embed_tokens.weight": 0.5})
    assert uses == {"encoder.embed_tokens": 0.5, "decoder.embed_tokens": 0.5, "decoder.output_projection": 0.5}


def test_per_layer_report_applies_multiplier_scales(tiny_data):
    from fairseq_gradinit.core.norms_and_spread import init_report

    fm = _model(tiny_data, "--share-all-embeddings")
    install_multipliers(fm.model)
    sample = _sample(fm)
    before = float(fm.model.encoder.embed_scale)
    scales = {"encoder.embed_tokens.weight": 0.5, "encoder.embed_scale": 3.0, "decoder.embed_scale": 0.5}
    report = init_report(fm.model, scales, [sample, sample], lambda m, b: _loss(fm, b))
    assert float(fm.model.encoder.embed_scale) == before  # restored
    assert "encoder.embed_scale" not in {t.name for t in report.tensors}
    # the multipliers were applied: the loss after differs from W scaled alone
    alone = init_report(fm.model, {"encoder.embed_tokens.weight": 0.5}, [sample, sample], lambda m, b: _loss(fm, b))
    assert report.loss_after != alone.loss_after and report.loss_before == alone.loss_before
