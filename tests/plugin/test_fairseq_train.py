"""End-to-end tests of the fairseq plugin on a tiny model and a slice of the Debian de-en corpus."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

fairseq = pytest.importorskip("fairseq")

from fairseq import options, tasks  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (registers the task)
from fairseq_gradinit.core import apply_scales  # noqa: E402
from fairseq_gradinit.fairseq_plugin.data.cfg import cfg_value  # noqa: E402
from fairseq_gradinit.fairseq_plugin.features.groups import transformer_group  # noqa: E402
from fairseq_gradinit.fairseq_plugin.registration.task import (  # noqa: E402
    TranslationGradInitConfig,
    TranslationGradInitTask,
    gradinit_config_from_task,
    will_restore_checkpoint,
)
from fairseq_gradinit.tools.user_dir import user_dir  # noqa: E402

from fairseq_helpers import REPO, free_port, run_ranks  # noqa: E402
from fairseq_train import (  # noqa: E402
    BIN, TINY_MODEL, assert_same_weights, checkpoint_state, env_with_repo, fresh_model, readme_train_commands,
    train_inprocess,
)

def test_first_update_starts_from_gradinit_weights_and_init_file(tiny_data, tmp_path, caplog):
    """lr=0 keeps the weights: the checkpoint after one update holds the start weights."""
    caplog.set_level("INFO")
    save_a = tmp_path / "a"
    common = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "0",
              "--max-update", "1"]
    train_inprocess(common + ["--save-dir", str(save_a), "--gradinit-iters", "4", "--gradinit-eta", "1e-3",
                              "--gradinit-lr", "0.05", "--gradinit-log-interval", "2"])
    info = json.loads((save_a / "gradinit.json").read_text())
    assert info["iterations"] == 4 and len(info["history"]) == 4
    umask = os.umask(0)
    os.umask(umask)
    assert (save_a / "gradinit.json").stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would create it
    assert info["config"]["optimizer"] == "adam" and info["config"]["eta"] == 1e-3
    # the plugin's Adam default: gamma = 2 x ||g||_1 at the init, measured and recorded; four simulated steps
    assert info["config"]["gamma_init_factor"] == 2.0 and info["config"]["lookahead_steps"] == 4
    assert info["config"]["resolved_gamma"] == info["gamma"] > 0
    # the resolved settings and what was derived from the training command are recorded
    assert info["max_tokens"] == 600  # 1.5 x 400
    assert set(info["derived"]) == {"optimizer", "gamma", "lookahead_steps", "max_tokens"}
    assert info["config"]["adam_state"] == "per_branch" and info["config"]["scale_bounds"][0] == ["bias", 0, None]
    assert set(info["summary"]) and all(s["min"] >= 0.01 for s in info["summary"].values())
    assert any(abs(v - 1.0) > 1e-4 for v in info["scales"].values())
    # Shared input/output embeddings: one scale.
    emb = [n for n in info["scales"] if "embed_tokens" in n or "output_projection" in n]
    assert len(emb) == 1, emb
    # The health check ran on GradInit's last batch: before/after gains of every LayerNorm, a verdict.
    health = info["health"]
    assert health["verdict"] == "ok" and health["reasons"] == [], health
    assert health["floor"]["weights"]["count"] == 0 and health["floor"]["weights"]["of"] > 0
    norms = {n["name"]: n for n in health["norms"]}
    assert "decoder.layers.1.final_layer_norm" in norms and len(norms) == 2 * 2 + 3 * 2
    for n in norms.values():
        assert n["kind"] == "layer_norm" and n["input_std_before"] > 0 and n["gain_after"] > 0
        assert n["gain_ratio"] == pytest.approx(n["gain_after"] / n["gain_before"])
    assert "gradinit: health: OK" in caplog.text and "decoder.layers." in caplog.text

    model = fresh_model(common + ["--save-dir", str(tmp_path / "unused")])
    apply_scales(model, info["scales"])
    state = checkpoint_state(save_a / "checkpoint_last.pt")
    assert_same_weights(model, state)

    # --gradinit-init-file reproduces the same start weights without computing.
    save_b = tmp_path / "b"
    train_inprocess(common + ["--save-dir", str(save_b), "--gradinit-init-file", str(save_a / "gradinit.json")])
    state_b = checkpoint_state(save_b / "checkpoint_last.pt")
    for k in state:
        assert torch.equal(state[k], state_b[k]), k


def test_train_then_resume_does_not_rerun(tiny_data, tmp_path, caplog):
    save = tmp_path / "ck"
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
            "--save-dir", str(save), "--gradinit-iters", "3", "--gradinit-monitor-interval", "2"]
    train_inprocess(argv + ["--max-update", "2"])
    gi = save / "gradinit.json"
    first = gi.read_text()
    assert json.loads(first)["iterations"] == 3
    assert (save / "checkpoint_last.pt").exists()
    assert will_restore_checkpoint(type("C", (), {"gradinit_save_dir": str(save),
                                                  "gradinit_restore_file": "checkpoint_last.pt",
                                                  "gradinit_checkpoint_suffix": "",
                                                  "gradinit_finetune_from_model": None})())
    caplog.set_level("INFO")
    train_inprocess(argv + ["--max-update", "4"])
    assert gi.read_text() == first
    assert "a checkpoint will be restored; not running GradInit" in caplog.text
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 4
    # the training monitor beside GradInit; the resumed run continues its file
    monitor = [json.loads(line) for line in (save / "monitor.jsonl").read_text().splitlines()]
    # (each validation also appends a "validation" record with the source gap: docs/monitor.md#source-use)
    assert [(r["type"], r["update"]) for r in monitor if r["type"] != "validation"] == \
        [("start", 0), ("interval", 2), ("start", 2), ("interval", 4)]


def test_training_monitor_without_gradinit(tiny_data, tmp_path):
    """--gradinit-monitor-interval on fairseq's plain translation task (no GradInit): the records' fields."""
    save = tmp_path / "ck"
    train_inprocess([str(tiny_data), "--user-dir", "fairseq_gradinit", *TINY_MODEL, "--lr", "1e-3",
                     "--max-update", "4", "--save-dir", str(save), "--gradinit-monitor-interval", "2"])
    assert not (save / "gradinit.json").exists()
    start, *records = [json.loads(line) for line in (save / "monitor.jsonl").read_text().splitlines()]
    intervals = [r for r in records if r["type"] != "validation"]
    assert all("src_gap" in r for r in records if r["type"] == "validation")
    assert start["type"] == "start" and start["update"] == 0 and start["interval"] == 2
    assert start["precision"] == "float32" and start["loss_scale"] is None and start["weights"] == "model"
    assert start["fixed_batch"]["ntokens"] > 0
    assert [(r["type"], r["update"]) for r in intervals] == [("interval", 2), ("interval", 4)]
    for r in intervals:
        assert r["loss_scale"] is None and r["overflows"] == 0 and r["skipped_updates"] == 0
        assert {"encoder.embed_tokens", "encoder.0.self_attn.q", "encoder.1.fc2", "decoder.1.encoder_attn.v",
                "decoder.0.final_layer_norm"} <= set(r["groups"])
        assert all(g["weight_norm"] > 0 for g in r["groups"].values())
        assert 0 < r["summary"]["max_update_ratio"] < 1
        assert set(r["norms"]) == {f"encoder.layers.{i}.{k}" for i in (0, 1) for k in ("self_attn_layer_norm",
                                                                                           "final_layer_norm")} | \
            {f"decoder.layers.{i}.{k}" for i in (0, 1) for k in ("self_attn_layer_norm", "encoder_attn_layer_norm",
                                                                  "final_layer_norm")}
        for n in r["norms"].values():
            assert n["eval"]["input_std"] > 0 and n["train"]["gain"] > 0
        assert r["fixed_batch_loss"]["eval"] > 0 and r["fixed_batch_loss"]["train"] > 0
    assert intervals[1]["fixed_batch_loss"]["eval"] < intervals[0]["fixed_batch_loss"]["eval"]  # it learns


def test_literal_usage_line_and_generate(tiny_data, tmp_path, monkeypatch, capsys, caplog):
    """`fairseq-train DATA --user-dir fairseq_gradinit --gradinit-iters N` with no --task, from the
    repo root; then generation from another directory with the installed-package user dir."""
    save = tmp_path / "ck"
    cmd = [str(BIN / "fairseq-train"), str(tiny_data), "--user-dir", "fairseq_gradinit", *TINY_MODEL,
           "--lr", "1e-3", "--max-update", "2", "--save-dir", str(save), "--gradinit-iters", "3"]
    proc = subprocess.run(cmd, cwd=REPO, env=env_with_repo(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (save / "gradinit.json").exists()
    assert "gradinit iter 3/3" in proc.stdout + proc.stderr

    # fairseq-generate's main, in this process (a second subprocess would only re-import torch and
    # fairseq); the checkpoint is loaded for inference, which must not run GradInit.
    from fairseq_cli import generate

    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    gen = [str(tiny_data), "--user-dir", user_dir(), "--path", str(save / "checkpoint_last.pt"), "--beam", "5",
           "--batch-size", "16", "--cpu", "--gen-subset", "test", "--max-len-b", "20"]
    args = options.parse_args_and_arch(options.get_generation_parser(), input_args=gen)
    generate.main(convert_namespace_to_omegaconf(args))
    out = capsys.readouterr().out + caplog.text
    assert "BLEU" in out
    assert "gradinit iter" not in out and "gradinit:" not in out


@pytest.mark.parametrize("ddp_backend", [
    "legacy_ddp",
    # fairseq wraps pytorch_ddp with device_ids=[rank], which torch rejects for CPU modules.
    pytest.param("pytorch_ddp", marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="fairseq's pytorch_ddp needs one GPU per rank")),
])
def test_two_rank_distributed_identical(tiny_data, tmp_path, ddp_backend):
    port = free_port()
    on_gpu = ddp_backend == "pytorch_ddp"
    save = tmp_path / "ck"
    driver = Path(__file__).resolve().parents[1] / "fairseq_dist_driver.py"
    cmds = []
    for rank in range(2):
        model_args = [a for a in TINY_MODEL if not (on_gpu and a == "--cpu")]
        cmd = [sys.executable, str(driver), str(tmp_path / f"rank{rank}.pt"), str(tiny_data),
               "--user-dir", str(REPO / "fairseq_gradinit"), "--task", "translation_gradinit", *model_args,
               "--lr", "1e-3", "--max-update", "2", "--save-dir", str(save), "--gradinit-iters", "3",
               "--gradinit-monitor-interval", "2", "--distributed-world-size", "2", "--distributed-rank", str(rank),
               "--distributed-backend", "nccl" if on_gpu else "gloo",
               "--distributed-init-method", f"tcp://127.0.0.1:{port}",
               *(["--device-id", str(rank)] if on_gpu else []),
               "--distributed-no-spawn", "--ddp-backend", ddp_backend]
        cmds.append(cmd)
    run_ranks(cmds, cwd=tmp_path, env=env_with_repo(), timeout=1200)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert r0["scales"] == r1["scales"]
    assert r0["world_size"] == 2
    for k in r0["after_gradinit"]:
        assert torch.equal(r0["after_gradinit"][k], r1["after_gradinit"][k]), k
    for k in r0["after_training"]:
        assert torch.equal(r0["after_training"][k], r1["after_training"][k]), k
    # each rank evaluated its own shard: the rank-0 losses differ from rank 1's before averaging
    assert r0["local_losses"] != r1["local_losses"]
    assert json.loads((save / "gradinit.json").read_text())["world_size"] == 2
    # the training monitor (measuring on rank 0 only) left the ranks identical; rank 0 alone wrote
    monitor = [json.loads(line) for line in (save / "monitor.jsonl").read_text().splitlines()
               if json.loads(line)["type"] != "validation"]
    assert [(r["type"], r["update"]) for r in monitor] == [("start", 0), ("interval", 2)]
    assert "encoder.0.fc1" in monitor[1]["groups"]


def test_config_translation_and_groups():
    cfg = type("C", (), dict(
        gradinit_optimizer=None, gradinit_train_optimizer="sgd", gradinit_eta=None, gradinit_train_lr=[0.15],
        gradinit_betas="(0.9, 0.98)", gradinit_gamma=None, gradinit_lr=1e-2, gradinit_iters=10,
        gradinit_min_scale=0.01, gradinit_max_scale=None, gradinit_overlap=0.5,
        gradinit_scale_grad_clip=None, gradinit_sgd_step="grad", gradinit_log_interval=5,
        gradinit_constraint_grad="exact", gradinit_fd_eps=1e-4, gradinit_adam_state="shared",
        gradinit_scale_bounds="[('bias', 0, None), ('norm', None, 100), ('re:fc1', 0.1, 2)]",
        gradinit_step_params="scaled"))()
    g = gradinit_config_from_task(cfg)
    assert g.optimizer == "sgd" and g.eta == 0.15 and g.norm_p == 2  # SGD: eta = --lr
    assert abs(g.resolved_gamma - 1.0) < 1e-12  # the paper's IWSLT SGD setting: eta*gamma^2 = 0.15
    assert [b.to_list() for b in g.scale_bounds] == [["bias", 0, None], ["norm", None, 100], ["re:fc1", 0.1, 2]]
    assert g.step_params == "scaled"
    for bad, msg in [("bias", "gradinit-scale-bounds"), ("[('norms', 0, 1)]", "expected one of"),
                     ("[('bias', 0, 1, 2)]", "scale bound")]:
        cfg.gradinit_scale_bounds = bad
        with pytest.raises(ValueError, match=msg):
            gradinit_config_from_task(cfg)
    cfg.gradinit_scale_bounds = "('bias', 0, None)"  # a single bound
    assert gradinit_config_from_task(cfg).scale_bounds[0].select == "bias"
    cfg.gradinit_betas = "0.9"
    with pytest.raises(ValueError, match="gradinit-betas"):
        gradinit_config_from_task(cfg)
    assert transformer_group("encoder.layers.0.self_attn.q_proj.weight") == "encoder.self_attn.q"
    assert transformer_group("decoder.layers.1.encoder_attn.out_proj.weight") == "decoder.encoder_attn.out"
    assert transformer_group("decoder.layers.1.fc2.weight") == "decoder.ffn.fc2"
    assert transformer_group("encoder.embed_tokens.weight") == "encoder.embeddings"
    assert transformer_group("encoder.layers.0.final_layer_norm.weight") == "encoder.layer_norm"
    assert transformer_group("encoder.layers.0.self_attn.k_proj.bias") == "encoder.bias.self_attn.k"
    assert issubclass(tasks.TASK_REGISTRY["translation"], TranslationGradInitTask)


@pytest.mark.parametrize("extra", [[], ["--cpu", "--gradinit-constraint-grad", "finite_difference",
                                          "--gradinit-adam-state", "shared"], ["--fp16"]])
def test_global_settings_resolve_from_the_command_line(extra):
    """The task's copies of global settings must follow them (a bool-typed copy once read as True)."""
    argv = ["data-bin-not-read", "--task", "translation_gradinit", *[a for a in TINY_MODEL if a != "--cpu"],
            "--lr", "3e-4", "--seed", "5", *extra]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    assert cfg_value(cfg.task, "gradinit_cpu") is ("--cpu" in extra)
    assert cfg_value(cfg.task, "gradinit_seed") == 5
    assert cfg_value(cfg.task, "gradinit_train_max_tokens") == 400
    gcfg = gradinit_config_from_task(cfg.task)
    assert gcfg.eta == 6e-4 and gcfg.fd_eps == 1e-4  # Adam: eta = 2 x --lr
    assert gcfg.constraint_grad == ("finite_difference" if "finite_difference" in extra else "exact")
    assert gcfg.adam_state == ("shared" if "shared" in extra else "per_branch")


def _resolved(argv):
    from fairseq_gradinit.fairseq_plugin.settings.option_values import derived_options, gradinit_batch_tokens

    ns = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    task_cfg = convert_namespace_to_omegaconf(ns).task
    return gradinit_config_from_task(task_cfg), gradinit_batch_tokens(task_cfg), derived_options(task_cfg)


def test_plain_usage_line_resolves_to_the_no_warmup_setting():
    """--gradinit-iters N and fairseq's own flags give, with Adam, the setting that trained the CPU testbed
    without warmup (its gi-look4 arm: gamma = 2 x the init's norm, four simulated steps, tau 1e-2) on the
    authors' IWSLT configuration otherwise; the authors' values given explicitly, a given gamma, the authors'
    simulated step and the paper's SGD setting keep what they say."""
    from lab.study.presets import TESTBED

    base = ["data-bin-not-read", "--task", "translation", *[a for a in TINY_MODEL if a not in ("--cpu",)]]
    i = base.index("--max-tokens")
    base[i + 1] = "4096"
    plain = base + ["--lr", "5e-4", "--gradinit-iters", "780"]
    g, tokens, derived = _resolved(plain)
    assert (g.optimizer, g.eta, g.gamma, g.gamma_init_factor, g.lr, g.lookahead_steps, g.betas, g.iters) == (
        "adam", 1e-3, None, 2.0, 1e-2, 4, (0.9, 0.98), 780)
    assert g.adam_state == "per_branch" and g.step_params == "all" and g.sgd_step == "grad"
    assert [b.to_list() for b in g.scale_bounds] == [["bias", 0, None], ["norm", None, 100]]
    assert tokens == 6144  # S = one 4096-token batch
    assert set(derived) == {"optimizer", "eta", "gamma", "lr", "lookahead_steps", "max_tokens"}
    # the testbed arm's explicit flags resolve to exactly what the plain usage line gets
    look = next(a for a in TESTBED.arms if a.name == "gi-look4").args
    assert _resolved(base + ["--lr", "5e-4", *look])[0] == _resolved(base + ["--lr", "5e-4", "--gradinit-iters", "200"])[0]
    # the authors' values given explicitly: their configuration, one simulated step
    g, _, _ = _resolved(plain + ["--gradinit-gamma", "1e3", "--gradinit-lr", "2.5e-3", "--gradinit-lookahead-steps", "1"])
    assert (g.eta, g.resolved_gamma, g.gamma_init_factor, g.lr, g.lookahead_steps) == (1e-3, 1e3, None, 2.5e-3, 1)
    g, _, _ = _resolved(plain + ["--gradinit-gamma", "1e3"])  # a given gamma replaces the factor only
    assert (g.resolved_gamma, g.gamma_init_factor, g.lookahead_steps, g.lr) == (1e3, None, 4, 1e-2)
    g, _, _ = _resolved(plain + ["--gradinit-unstepped-uses", r"decoder\.output_projection\."])
    assert (g.lookahead_steps, g.gamma_init_factor) == (1, 2.0)  # the simulated steps would move every use
    # explicit values win, and '[]' turns the group bounds off
    g, tokens, derived = _resolved(plain + ["--gradinit-eta", "5e-4", "--gradinit-max-tokens", "6000",
                                            "--gradinit-scale-bounds", "[]"])
    assert (g.eta, g.gamma_init_factor, g.scale_bounds, tokens) == (5e-4, 2.0, (), 6000)
    assert derived == ["optimizer", "gamma", "lr", "lookahead_steps"]
    sgd = [a for a in base if a not in ("--adam-betas", "(0.9, 0.98)")]
    sgd[sgd.index("--optimizer") + 1] = "sgd"
    g, _, _ = _resolved(sgd + ["--momentum", "0.9", "--lr", "0.15", "--gradinit-iters", "780"])
    assert (g.optimizer, g.eta, g.norm_p, g.lr, g.lookahead_steps, g.gamma_init_factor) == ("sgd", 0.15, 2, 2.5e-3, 1, None)
    assert abs(g.resolved_gamma - 1.0) < 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16/bf16 training in fairseq needs CUDA")
@pytest.mark.parametrize("precision", ["--fp16", "--bf16"])
def test_half_precision_starts_from_gradinit_weights(tiny_data, tmp_path, precision):
    """GradInit runs in fp32 on the GPU before fairseq casts the model and copies fp32 masters."""
    model_args = [a for a in TINY_MODEL if a != "--cpu"]
    save = tmp_path / "ck"
    common = [str(tiny_data), "--task", "translation_gradinit", *model_args, "--lr", "0", "--max-update", "1",
              precision]
    # fairseq-train's command line turns --bf16 into --tpu (options.parse_args_and_arch); bf16 on a
    # GPU is the configuration fairseq-hydra-train builds (common.bf16=true, common.tpu=false).
    train_inprocess(common + ["--save-dir", str(save), "--gradinit-iters", "4", "--gradinit-eta", "1e-3",
                              "--gradinit-lr", "0.05"], tpu=False)
    info = json.loads((save / "gradinit.json").read_text())
    assert info["device"].startswith("cuda")
    model = fresh_model(common + ["--save-dir", str(tmp_path / "unused")])
    apply_scales(model, info["scales"])
    dtype = torch.float16 if precision == "--fp16" else torch.bfloat16
    model.to(dtype)
    assert_same_weights(model, checkpoint_state(save / "checkpoint_last.pt"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 training in fairseq needs CUDA")
def test_training_monitor_records_fp16_overflows(tiny_data, tmp_path):
    """A loss scale far too large makes the first fp16 steps overflow: each is recorded with the scale
    and the parameters whose gradient overflowed, and the interval record counts them as skipped."""
    model_args = [a for a in TINY_MODEL if a != "--cpu"]
    save = tmp_path / "ck"
    train_inprocess([str(tiny_data), "--task", "translation_gradinit", *model_args, "--lr", "1e-3",
                     "--max-update", "2", "--fp16", "--fp16-init-scale", str(2 ** 24), "--save-dir", str(save),
                     "--gradinit-monitor-interval", "2"])
    recs = [json.loads(line) for line in (save / "monitor.jsonl").read_text().splitlines()]
    start, overflows, interval = recs[0], [r for r in recs if r["type"] == "overflow"], recs[-1]
    assert start["precision"] == "float16" and start["weights"] == "fp32 master"
    assert start["loss_scale"] == 2 ** 24 and start["optimizer"] == "FP16Optimizer"
    assert overflows and overflows[0]["update"] == 0 and overflows[0]["error"] == "OverflowError"
    assert (overflows[0]["loss_scale"], overflows[0]["loss_scale_after"]) == (2 ** 24, 2 ** 23)
    assert overflows[0]["nonfinite"]["count"] >= 1
    assert overflows[0]["nonfinite"]["first"]["param"].startswith(("encoder.", "decoder."))
    assert interval["type"] == "interval" and interval["update"] == 2
    assert interval["overflows"] >= len(overflows) and interval["skipped_updates"] == interval["overflows"]
    assert interval["loss_scale"] <= 2 ** 23 and "decoder.1.fc1" in interval["groups"]


def test_docs_flag_table_and_commands_match_the_task():
    """Every --gradinit-* option is in docs/options.md's table, and the fairseq-train commands of the README and
    docs/fairseq.md parse with the task (a flag that exists only in the docs would fail here)."""
    table = (REPO / "docs" / "options.md").read_text()
    text = (REPO / "README.md").read_text() + (REPO / "docs" / "fairseq.md").read_text()
    options_of_task = {"--" + f.name.replace("_", "-") for f in TranslationGradInitConfig.__dataclass_fields__.values()
                       if f.name.startswith("gradinit_") and f.metadata.get("help")}
    assert len(options_of_task) >= 15
    missing = sorted(o for o in options_of_task if f"`{o}" not in table)
    assert not missing, f"docs/options.md's flag table lacks {missing}"
    cmds = readme_train_commands(text)
    assert len(cmds) >= 3
    for argv in cmds:
        args = argv[1:]
        i = args.index("--user-dir")
        del args[i:i + 2]  # the plugin is imported already
        ns = options.parse_args_and_arch(options.get_training_parser(), input_args=args)
        gcfg = gradinit_config_from_task(convert_namespace_to_omegaconf(ns).task)
        if any(a.startswith("--gradinit-") for a in args):  # not the w_skip section's Admin-only commands
            assert ns.gradinit_iters > 0 and gcfg.iters == ns.gradinit_iters


def test_valid_loss_modes_script(tiny_data, tmp_path, caplog):
    """scripts/valid_loss_modes.py: its eval-mode loss is fairseq's own validation loss of the same
    checkpoint; with dropout on it differs when the model has dropout, and not when it has none."""
    import re

    from fairseq_gradinit.tools import valid_loss_modes
    caplog.set_level("INFO")
    results = {}
    for dropout in ("0.3", "0"):
        save = tmp_path / f"d{dropout}"
        argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "5e-3", "--max-update", "3",
                "--save-dir", str(save), "--dropout", dropout]
        caplog.clear()
        train_inprocess(argv)
        logged = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+) .*num_updates 3", caplog.text)
        assert logged, caplog.text[-2000:]
        out = tmp_path / f"modes{dropout}.json"
        res = valid_loss_modes.main([str(tiny_data), "--path", str(save / "checkpoint_last.pt"), "--cpu",
                                     "--output-json", str(out)])
        written = json.loads(out.read_text())
        assert written.pop("written_by") == "gradinit-valid-loss-modes"  # marked as this command's output
        assert written == res
        assert res["num_updates"] == 3 and res["dropout"] == float(dropout)
        assert abs(res["loss_eval"] - float(logged[-1])) < 1e-3, (res, logged)
        results[dropout] = res
    assert abs(results["0.3"]["gap"]) > 1e-4
    assert results["0"]["gap"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(SystemExit, match="checkpoint not found"):
        valid_loss_modes.main([str(tiny_data), "--path", str(tmp_path / "missing.pt")])
