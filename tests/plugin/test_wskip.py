"""transformer_wskip (Admin's w_skip Post-LN Transformer), its three omega initializations and
GradInit on it, on a tiny model and a slice of the Debian de-en corpus."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

from fairseq_gradinit.core.admin import AdminProfile, closed_form_omega  # noqa: E402
from fairseq_gradinit.fairseq_plugin.features.groups import transformer_group  # noqa: E402
from fairseq_gradinit.fairseq_plugin.models.wskip import ADMIN_JSON, WSkipTransformerModel, admin_profile  # noqa: E402

# The tiny corpus, model options and fairseq-train helpers of the plugin tests.
from fairseq_helpers import free_port, run_ranks  # noqa: E402
from fairseq_train import (  # noqa: E402
    REPO, TINY_MODEL, checkpoint_state, env_with_repo, fresh_model, readme_train_commands, train_inprocess,
)

WSKIP_MODEL = ["transformer_wskip_iwslt_de_en" if a == "transformer_iwslt_de_en" else a for a in TINY_MODEL]
OMEGA_NAMES = sorted(
    [f"encoder.layers.{i}.omega_{k}" for i in range(2) for k in ("self_attn", "ffn")]
    + [f"decoder.layers.{i}.omega_{k}" for i in range(2) for k in ("self_attn", "encoder_attn", "ffn")])


def _argv(data, *extra):
    return [str(data), "--task", "translation_gradinit", *WSKIP_MODEL, *extra]


def _omegas(state_or_model):
    sd = state_or_model if isinstance(state_or_model, dict) else dict(state_or_model.named_parameters())
    return {k: v for k, v in sd.items() if ".omega_" in k}


def _sample(model, n=3):
    """A collated batch of the first ``n`` training sentences (different lengths: padded)."""
    task = model._wskip_test_task
    task.load_dataset("train")
    ds = task.dataset("train")
    return ds.collater([ds[i] for i in range(n)])


def _model(data, *extra):
    from fairseq import tasks, utils

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=_argv(data, *extra))
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    model._wskip_test_task = task
    return model


# ------------------------------------------------------------------------------------------------
def test_architectures_match_fairseq_and_pre_ln_is_rejected(tiny_data):
    parser = options.get_training_parser
    for wskip, stock in (("transformer_wskip_iwslt_de_en", "transformer_iwslt_de_en"),
                         ("transformer_wskip_wmt_en_de", "transformer_wmt_en_de")):
        a = vars(options.parse_args_and_arch(parser(), input_args=[str(tiny_data), "--arch", wskip]))
        b = vars(options.parse_args_and_arch(parser(), input_args=[str(tiny_data), "--arch", stock]))
        assert a.pop("wskip_init") == "ones" and a.pop("wskip_profile_seed") is None
        a.pop("arch"), b.pop("arch")
        assert a == b
    # Configs not parsed from a command line are refused when the model is built.
    from fairseq import tasks

    for side in ("encoder", "decoder"):
        args = options.parse_args_and_arch(parser(), input_args=_argv(tiny_data))
        setattr(args, f"{side}_normalize_before", True)
        task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
        with pytest.raises(ValueError, match=f"Post-LN.*--{side}-normalize-before"):
            WSkipTransformerModel.build_model(args, task)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_pre_ln_is_an_argument_error_when_parsed(tiny_data, side, capsys):
    """The refusal is argparse's (usage, one 'error:' line, exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        options.parse_args_and_arch(options.get_training_parser(), input_args=[
            str(tiny_data), "--task", "translation_gradinit", "--arch", "transformer_wskip_iwslt_de_en",
            f"--{side}-normalize-before"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
    assert (f"error: argument --{side}-normalize-before: not allowed with --arch transformer_wskip_iwslt_de_en: "
            "transformer_wskip is Admin's w_skip variant of the Post-LN Transformer") in err, err[-600:]


def test_omega_placement_and_ones_is_plain_post_ln(tiny_data):
    """Two omega of shape (d,) per encoder layer, three per decoder layer, all ones; with ones the
    model computes exactly what fairseq's transformer does with the same weights; each omega
    multiplies the shortcut of its own residual."""
    model = _model(tiny_data, "--dropout", "0")
    omegas = _omegas(model)
    assert sorted(omegas) == OMEGA_NAMES
    assert all(p.shape == (32,) and p.requires_grad and torch.all(p == 1) for p in omegas.values())
    stock = fresh_model([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--dropout", "0"])
    stock.load_state_dict({k: v for k, v in model.state_dict().items() if ".omega_" not in k}, strict=True)
    sample = _sample(model)
    model.eval(), stock.eval()
    with torch.no_grad():
        out = model(**sample["net_input"])[0]
        torch.testing.assert_close(out, stock(**sample["net_input"])[0], rtol=0, atol=0)
        # omega_ffn of the last decoder layer scales the shortcut into that layer's final LayerNorm.
        layer = model.decoder.layers[1]
        seen = {}
        hook = layer.final_layer_norm.register_forward_hook(lambda m, i, o: seen.setdefault("in", i[0]))
        try:
            model(**sample["net_input"])
            base = seen.pop("in")
            layer.omega_ffn.mul_(3.0)
            model(**sample["net_input"])
            scaled = seen.pop("in")
        finally:
            hook.remove()
        # LN input = residual * omega + f(x): tripling omega adds 2 * residual, the LN input of the
        # block before it (the encoder-attention output after its LayerNorm) being the residual.
        shortcut = scaled - base
        assert shortcut.abs().max() > 1e-3
        torch.testing.assert_close(shortcut.pow(2).mean(-1), torch.full_like(shortcut[..., 0], 4.0), rtol=1e-3,
                                   atol=1e-3)  # 2 * (a LayerNorm output: unit mean square per position)


def test_admin_profile_matches_hand_computation(tiny_data):
    """Admin's rule on a 2-layer model, by hand with numpy: omega_1 = 1, omega_{i+1} =
    sqrt(var(x_i * omega_i) + var(f_i)), np.var over every entry of the (T, B, C) tensors (padding
    included), encoder and decoder separately, branches after dropout (dropout 0 here)."""
    model = _model(tiny_data, "--dropout", "0", "--wskip-init", "admin")
    sample = _sample(model)
    src, prev = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
    assert src.eq(model.encoder.padding_idx).any() and prev.eq(model.decoder.padding_idx).any()

    # The decoder's embedded input does not depend on omega: take it from a forward pass.
    captured = {}
    pre = model.decoder.layers[0].register_forward_pre_hook(lambda m, a: captured.setdefault("x", a[0]))
    model.eval()
    with torch.no_grad():
        model(**sample["net_input"])
    pre.remove()

    def var(t):
        return float(np.var(t.detach().numpy().astype(np.float64)))

    expected = {}
    with torch.no_grad():
        enc = model.encoder
        pad = src.eq(enc.padding_idx)
        x, _ = enc.forward_embedding(src)
        x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
        r = 1.0
        for i, layer in enumerate(enc.layers):
            a, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=pad, need_weights=False)
            expected[f"encoder.layers.{i}.omega_self_attn"], r = r, math.sqrt(var(x * r) + var(a))
            x = layer.self_attn_layer_norm(x * expected[f"encoder.layers.{i}.omega_self_attn"] + a)
            f = layer.fc2(torch.relu(layer.fc1(x)))
            expected[f"encoder.layers.{i}.omega_ffn"], r = r, math.sqrt(var(x * r) + var(f))
            x = layer.final_layer_norm(x * expected[f"encoder.layers.{i}.omega_ffn"] + f)
        enc_out, dec = x, model.decoder
        x, r = captured["x"], 1.0
        tgt_pad = prev.eq(dec.padding_idx)
        future = dec.buffered_future_mask(x)
        for i, layer in enumerate(dec.layers):
            a, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=tgt_pad, attn_mask=future,
                                   need_weights=False)
            k = f"decoder.layers.{i}.omega_self_attn"
            expected[k], r = r, math.sqrt(var(x * r) + var(a))
            x = layer.self_attn_layer_norm(x * expected[k] + a)
            c, _ = layer.encoder_attn(query=x, key=enc_out, value=enc_out, key_padding_mask=pad, static_kv=True,
                                      need_weights=False)
            k = f"decoder.layers.{i}.omega_encoder_attn"
            expected[k], r = r, math.sqrt(var(x * r) + var(c))
            x = layer.encoder_attn_layer_norm(x * expected[k] + c)
            f = layer.fc2(torch.relu(layer.fc1(x)))
            k = f"decoder.layers.{i}.omega_ffn"
            expected[k], r = r, math.sqrt(var(x * r) + var(f))
            x = layer.final_layer_norm(x * expected[k] + f)

    rng = torch.get_rng_state()
    values = admin_profile(model, sample)
    assert torch.equal(torch.get_rng_state(), rng)  # the profile leaves the random stream alone
    assert model.training is False  # mode restored
    assert sorted(values) == OMEGA_NAMES
    for name, p in _omegas(model).items():
        assert torch.all(p == p[0]), name
        assert values[name] == pytest.approx(expected[name], rel=1e-5), name
    assert values["encoder.layers.0.omega_self_attn"] == 1.0 == values["decoder.layers.0.omega_self_attn"]
    assert values["encoder.layers.1.omega_ffn"] > values["encoder.layers.0.omega_ffn"] > 1.0


def test_admin_profile_helper_and_closed_form():
    prof = AdminProfile()
    omega_a, omega_b = torch.zeros(4), torch.zeros(4)
    x, f = torch.arange(8.0).view(2, 4), torch.ones(2, 4)
    prof.visit(omega_a, f, x)
    prof.visit(omega_b, f, x)
    assert torch.all(omega_a == 1.0)
    assert torch.allclose(omega_b, torch.tensor(math.sqrt(np.var(np.arange(8.0)) + 0.0)))
    assert prof.values() == pytest.approx([1.0, math.sqrt(np.var(np.arange(8.0)))])
    # admin-torch 0.1.0's calculate_init ('O(logn)'): sqrt((N+1)/ln(N+1) - 1)
    assert closed_form_omega(12, use_package=False) == pytest.approx(math.sqrt(13 / math.log(13) - 1))
    with pytest.raises(ValueError, match="positive integer"):
        closed_form_omega(0)


def test_closed_form_is_admin_torch():
    admin_torch = pytest.importorskip("admin_torch")
    for n in (1, 2, 4, 6, 12, 18, 36, 200):
        assert closed_form_omega(n, use_package=False) == pytest.approx(admin_torch.calculate_init(n), rel=1e-12)
        assert closed_form_omega(n) == admin_torch.calculate_init(n)


def test_inits_ones_and_closed_form_and_pending_admin(tiny_data):
    model = _model(tiny_data, "--wskip-init", "admin-closed-form")
    for name, p in _omegas(model).items():
        n = 2 * 2 if name.startswith("encoder") else 3 * 2  # residuals of the 2-layer stack
        assert torch.allclose(p, torch.tensor(math.sqrt((n + 1) / math.log(n + 1) - 1))), name
    assert model.wskip_init == "admin-closed-form"
    # An admin model that was never profiled refuses to train (it would silently start at omega = 1) ...
    admin = _model(tiny_data, "--wskip-init", "admin")
    sample = _sample(admin)
    admin.train()
    with pytest.raises(RuntimeError, match="not been profiled"):
        admin(**sample["net_input"])
    # ... until it is profiled or loads weights (resume, inference).
    admin.load_state_dict(model.state_dict())
    admin(**sample["net_input"])


def test_docs_have_one_command_per_init():
    doc = (REPO / "docs" / "wskip.md").read_text()
    cmds = [c for c in readme_train_commands(doc) if "transformer_wskip_iwslt_de_en" in c]
    inits = []
    for argv in cmds:
        args = argv[1:]
        i = args.index("--user-dir")
        del args[i:i + 2]  # the plugin is imported already
        ns = options.parse_args_and_arch(options.get_training_parser(), input_args=args)
        inits.append((ns.wskip_init, ns.gradinit_iters > 0))
    assert sorted(inits) == [("admin", False), ("admin-closed-form", False), ("ones", True)]


def test_scale_summary_groups_name_omega():
    assert transformer_group("encoder.layers.0.omega_self_attn") == "encoder.omega.self_attn"
    assert transformer_group("decoder.layers.5.omega_encoder_attn") == "decoder.omega.encoder_attn"
    assert transformer_group("decoder.layers.5.omega_ffn") == "decoder.omega.ffn"


def test_admin_then_gradinit_end_to_end_and_generate(tiny_data, tmp_path, monkeypatch):
    """fairseq-train with --wskip-init admin profiles before the first update (GradInit off), and
    before GradInit when GradInit is on (omega = Admin value x GradInit scale); a resumed run does
    not re-profile; the checkpoint loads in scripts/evaluate_bleu.py (fairseq-generate)."""
    common = _argv(tiny_data, "--lr", "0", "--max-update", "1", "--wskip-init", "admin")
    admin_dir, both_dir = tmp_path / "admin", tmp_path / "both"
    from fairseq.trainer import Trainer

    first_ids, train_step = [], Trainer.train_step

    def recording_train_step(self, samples, *args, **kwargs):
        first_ids.append(samples[0]["id"].tolist())
        return train_step(self, samples, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", recording_train_step)
    train_inprocess(common + ["--save-dir", str(admin_dir)])
    monkeypatch.undo()
    profile = json.loads((admin_dir / ADMIN_JSON).read_text())
    assert sorted(profile["omega"]) == OMEGA_NAMES and profile["nsentences"] > 0
    assert profile["sample_ids"] == first_ids[0]  # the batch of the first update
    state = checkpoint_state(admin_dir / "checkpoint_last.pt")
    for name, p in _omegas(state).items():
        assert torch.all(p == profile["omega"][name]), name
    assert len({round(v, 6) for v in profile["omega"].values()}) > 2

    train_inprocess(common + ["--save-dir", str(both_dir), "--gradinit-iters", "3", "--gradinit-lr", "0.05",
                            "--gradinit-eta", "1e-3"])
    assert json.loads((both_dir / ADMIN_JSON).read_text()) == profile  # same seed, same batch
    gi = json.loads((both_dir / "gradinit.json").read_text())
    assert set(OMEGA_NAMES) <= set(gi["scales"])
    assert {"encoder.omega.self_attn", "encoder.omega.ffn", "decoder.omega.self_attn", "decoder.omega.encoder_attn",
            "decoder.omega.ffn"} <= set(gi["summary"])
    state = checkpoint_state(both_dir / "checkpoint_last.pt")
    for name, p in _omegas(state).items():
        torch.testing.assert_close(p, torch.full_like(p, profile["omega"][name] * gi["scales"][name]))
    assert any(abs(gi["scales"][n] - 1) > 1e-3 for n in OMEGA_NAMES)

    # Resume: the checkpoint's omega are kept, no second profile, training goes on.
    before = (admin_dir / ADMIN_JSON).stat().st_mtime_ns
    train_inprocess(_argv(tiny_data, "--lr", "1e-3", "--max-update", "2", "--wskip-init", "admin",
                          "--save-dir", str(admin_dir)))
    assert (admin_dir / ADMIN_JSON).stat().st_mtime_ns == before
    trained = _omegas(checkpoint_state(admin_dir / "checkpoint_last.pt"))
    assert any(not torch.equal(trained[n], torch.full_like(trained[n], profile["omega"][n])) for n in OMEGA_NAMES)

    from fairseq_gradinit.tools import evaluate_bleu
    out = tmp_path / "bleu.json"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(admin_dir / "checkpoint_last.pt"), "--user-dir", "gradinit",
                             "--cpu", "--batch-size", "40", "--beam", "2", "--output-json", str(out), "--",
                             "--max-len-b", "10"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["n_sentences"] == result["n_subset_sentences"] == 40 and result["bleu"] >= 0


def test_bad_gradinit_value_stops_before_the_admin_profile(tiny_data, tmp_path):
    """A bad --gradinit-* value in a config that skipped the parser (fairseq-hydra-train, Python)
    stops the run before Admin's profiling runs or writes anything."""
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    save = tmp_path / "ck"
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=_argv(
        tiny_data, "--wskip-init", "admin", "--lr", "1e-3", "--max-update", "1", "--save-dir", str(save),
        "--gradinit-iters", "3"))
    cfg = convert_namespace_to_omegaconf(args)
    cfg.task.gradinit_overlap = 2.0
    with pytest.raises(SystemExit, match="argument --gradinit-overlap: invalid value 2.0"):
        distributed_utils.call_main(cfg, train.main)
    assert not (save / ADMIN_JSON).exists()


def test_two_gloo_ranks_end_with_identical_omega(tiny_data, tmp_path):
    """Ranks started from different weights (different seeds) profile different batches and
    weights; rank 0's omega is broadcast, so both train from, and end with, the same omega."""
    port = free_port()
    driver = Path(__file__).resolve().parents[1] / "fairseq_dist_driver.py"
    cmds = []
    for rank in range(2):
        cmd = [sys.executable, str(driver), str(tmp_path / f"rank{rank}.pt"), str(tiny_data),
               "--user-dir", str(REPO / "fairseq_gradinit"), "--task", "translation_gradinit", *WSKIP_MODEL,
               "--seed", str(3 + rank), "--wskip-init", "admin", "--lr", "0", "--max-update", "1",
               "--save-dir", str(tmp_path / "ck"), "--distributed-world-size", "2", "--distributed-rank", str(rank),
               "--distributed-backend", "gloo", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
               "--distributed-no-spawn", "--ddp-backend", "legacy_ddp"]
        cmds.append(cmd)
    run_ranks(cmds, cwd=tmp_path, env=env_with_repo(), timeout=600)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)["after_training"]
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)["after_training"]
    assert not torch.equal(r0["encoder.layers.0.fc1.weight"], r1["encoder.layers.0.fc1.weight"])
    omegas = _omegas(r0)
    assert sorted(omegas) == OMEGA_NAMES
    for name in OMEGA_NAMES:
        assert torch.equal(r0[name], r1[name]), name
    assert any(float(v[0]) != 1.0 for v in omegas.values())


def test_profile_seed_gives_every_seed_the_omega_of_seed_1111(tiny_data, tmp_path):
    """--wskip-profile-seed S: omega is profiled on a twin built (and batched) as fairseq-train does with
    seed S, as the Admin authors profile once with seed 1111 and reuse omega across seeds; the run's own
    weights are those of its own --seed (the twin leaves the random state alone)."""
    def run(name, *extra):
        save = tmp_path / name
        train_inprocess(_argv(tiny_data, "--lr", "0", "--max-update", "1", "--wskip-init", "admin",
                              "--save-dir", str(save), *extra))
        return json.loads((save / ADMIN_JSON).read_text()), checkpoint_state(save / "checkpoint_last.pt")

    ref, _ = run("s1111", "--seed", "1111")
    p1, _ = run("s1", "--seed", "1", "--wskip-profile-seed", "1111")
    p2, state2 = run("s2", "--seed", "2", "--wskip-profile-seed", "1111")
    own2, plain2 = run("s2-own", "--seed", "2")
    assert p1["omega"] == p2["omega"] == ref["omega"] and p2["profile_seed"] == 1111
    assert own2["omega"] != ref["omega"]
    for k, v in plain2.items():
        if torch.is_floating_point(v) and ".omega_" not in k:
            assert torch.equal(v, state2[k]), k
    for name, p in _omegas(state2).items():
        assert torch.all(p == ref["omega"][name]), name
    with pytest.raises(SystemExit) as exc:  # only with --wskip-init admin: an argument error
        options.parse_args_and_arch(options.get_training_parser(),
                                    input_args=_argv(tiny_data, "--wskip-profile-seed", "1111"))
    assert exc.value.code == 2
