"""GradInit with fairseq tasks other than translation_gradinit: language modeling (Pre-LN and the
plugin's Post-LN architecture), translation with another criterion, masked LM, legacy tasks, and
GradInit's batches (over-long samples skipped, impossible settings refused when parsed)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (serves every task)
from fairseq_gradinit.fairseq_plugin.registration.hook import GradInitTaskMixin  # noqa: E402

from fairseq_helpers import REPO, free_port, make_tiny_bin, make_tiny_lm_bin, run_ranks  # noqa: E402
from fairseq_train import TINY_LM, train  # noqa: E402

TINY_MT = [
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--cpu",
    "--no-epoch-checkpoints", "--log-format", "simple", "--num-workers", "0", "--seed", "3", "--no-progress-bar",
]


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return make_tiny_lm_bin(tmp_path_factory.mktemp("lmdata"), {"train": 200, "valid": 30}, 500)


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    return make_tiny_bin(tmp_path_factory.mktemp("mtdata"), {"train": 150, "valid": 20, "test": 20}, 500)





def parse(argv):
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


def train_then_resume(argv, save, caplog):
    """Train 1 update with GradInit, then resume to 2: GradInit must not run again."""
    train(argv + ["--max-update", "1"])
    gi = save / "gradinit.json"
    first = gi.read_text()
    saved = json.loads(first)
    assert saved["iterations"] == 2
    assert any(abs(v - 1.0) > 1e-6 for v in saved["scales"].values())
    caplog.clear()
    caplog.set_level("INFO")
    train(argv + ["--max-update", "2"])
    assert "a checkpoint will be restored; not running GradInit" in caplog.text
    assert "gradinit iter" not in caplog.text
    assert gi.read_text() == first
    return saved


# fairseq's named LM architectures (transformer_lm_big, ...) force Pre-LN; transformer_lm_postln does not.
@pytest.mark.parametrize("arch, post_ln", [("transformer_lm_big", False), ("transformer_lm_postln", True)])
def test_language_model_gradinit_then_resume(lm_data, tmp_path, caplog, arch, post_ln):
    save = tmp_path / "ck"
    built = {}
    original = GradInitTaskMixin.run

    def spy(self, plan, model, criterion):
        built["post_ln"] = not model.decoder.layers[0].normalize_before
        built["task"] = type(self).__name__
        return original(self, plan, model, criterion)

    GradInitTaskMixin.run = spy
    try:
        saved = train_then_resume([str(lm_data), "--arch", arch, *TINY_LM, "--save-dir", str(save),
                                   "--gradinit-iters", "2", "--gradinit-monitor-interval", "1"], save, caplog)
    finally:
        GradInitTaskMixin.run = original
    assert built == {"post_ln": post_ln, "task": "LanguageModelingTaskWithGradInit"}
    assert saved["fingerprint"]["data"]["tokens_per_sample"] == 32
    assert "decoder.layers.1.fc2.weight" in saved["scales"]
    # the training monitor on a language model, continued by the resumed run
    monitor = (save / "monitor.jsonl").read_text()
    records = [json.loads(line) for line in monitor.splitlines()]
    assert [(r["type"], r["update"]) for r in records] == [("start", 0), ("interval", 1), ("start", 1), ("interval", 2)]
    assert "decoder.1.fc2" in records[-1]["groups"] and "decoder.layers.1.final_layer_norm" in records[-1]["norms"]

    # Loading the checkpoint for inference (fairseq-eval-lm) never runs GradInit, nor the monitor.
    from fairseq_cli import eval_lm

    caplog.clear()
    args = options.parse_args_and_arch(options.get_eval_lm_parser(), input_args=[
        str(lm_data), "--path", str(save / "checkpoint_last.pt"), "--cpu", "--max-tokens", "256",
        "--tokens-per-sample", "32", "--gen-subset", "valid"])
    eval_lm.main(convert_namespace_to_omegaconf(args))
    assert "Perplexity" in caplog.text
    assert "gradinit iter" not in caplog.text and "gradinit:" not in caplog.text
    assert (save / "monitor.jsonl").read_text() == monitor


@pytest.mark.parametrize("criterion", [["--criterion", "cross_entropy"],
                                       ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]])
def test_translation_task_and_criteria(mt_data, tmp_path, caplog, criterion):
    save = tmp_path / "ck"
    saved = train_then_resume([str(mt_data), "--task", "translation", *TINY_MT, *criterion, "--save-dir", str(save),
                               "--gradinit-iters", "2"], save, caplog)
    assert saved["fingerprint"]["criterion"]["_name"] == criterion[1]


def test_masked_lm_task(lm_data, tmp_path, caplog):
    save = tmp_path / "ck"
    argv = [str(lm_data), "--task", "masked_lm", "--arch", "roberta", "--encoder-layers", "1",
            "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
            "--tokens-per-sample", "32", "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "1e-3",
            "--max-tokens", "256", "--cpu", "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "3",
            "--no-progress-bar", "--save-dir", str(save), "--gradinit-iters", "2"]
    saved = train_then_resume(argv, save, caplog)
    assert any(k.startswith("encoder.sentence_encoder.layers.0.") for k in saved["scales"])


@pytest.fixture(scope="module")
def sp_data(tmp_path_factory):
    """sentence_prediction data: input0/ is a tiny LM data-bin, label/ an even/odd word count label."""
    from fairseq_cli import preprocess

    root = tmp_path_factory.mktemp("spdata")
    lm = make_tiny_lm_bin(root, {"train": 120, "valid": 20}, 400)
    (root / "data").mkdir()
    lm.rename(root / "data" / "input0")
    argv = ["--only-source", "--destdir", str(root / "data" / "label"), "--workers", "1"]
    for split, pref in (("train", "--trainpref"), ("valid", "--validpref")):
        lines = (root / f"{split}.txt").read_text(encoding="utf-8").splitlines()
        labels = ["even" if len(line.split()) % 2 == 0 else "odd" for line in lines]
        (root / f"{split}.lab").write_text("\n".join(labels) + "\n")
        argv += [pref, str(root / f"{split}.lab")]
    preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    return root / "data"


def test_sentence_prediction_task(sp_data, tmp_path, caplog):
    save = tmp_path / "ck"
    argv = [str(sp_data), "--task", "sentence_prediction", "--num-classes", "2", "--arch", "roberta",
            "--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "2", "--max-positions", "64", "--criterion", "sentence_prediction",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--cpu", "--no-epoch-checkpoints",
            "--num-workers", "0", "--seed", "3", "--no-progress-bar", "--save-dir", str(save), "--gradinit-iters", "2"]
    saved = train_then_resume(argv, save, caplog)
    assert any("classification_heads" in k for k in saved["scales"])


def test_two_ranks_identical_lm_scales(lm_data, tmp_path):
    port = free_port()
    driver = Path(__file__).resolve().parents[1] / "fairseq_dist_driver.py"
    cmds = [[sys.executable, str(driver), str(tmp_path / f"rank{rank}.pt"), str(lm_data),
             "--user-dir", str(REPO / "fairseq_gradinit"), "--arch", "transformer_lm_postln", *TINY_LM,
             "--max-update", "1", "--save-dir", str(tmp_path / "ck"), "--gradinit-iters", "2",
             "--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-backend", "gloo",
             "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
             "--ddp-backend", "legacy_ddp"] for rank in range(2)]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run_ranks(cmds, cwd=tmp_path, env=env, timeout=600)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert r0["world_size"] == 2 and r0["scales"] == r1["scales"]
    assert r0["local_losses"] != r1["local_losses"]  # each rank drew its own shard


def test_over_long_samples_are_skipped_and_counted(mt_data, tmp_path, caplog):
    caplog.set_level("INFO")
    save = tmp_path / "ck"
    # 12 tokens per batch: longer sentence pairs cannot fit and are skipped, as fairseq-train skips them.
    train([str(mt_data), "--task", "translation", *TINY_MT, "--criterion", "cross_entropy", "--save-dir", str(save),
           "--gradinit-iters", "2", "--gradinit-max-tokens", "12", "--max-update", "1"])
    assert json.loads((save / "gradinit.json").read_text())["iterations"] == 2
    assert "training samples skipped (longer than max positions" in caplog.text


def run_cli(argv, cwd):
    cmd = [sys.executable, "-m", "fairseq_cli.train", *argv, "--user-dir", str(REPO / "fairseq_gradinit")]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_every_sample_filtered_out_says_so(mt_data, tmp_path):
    proc = run_cli([str(mt_data), "--task", "translation", *TINY_MT, "--criterion", "cross_entropy",
                    "--save-dir", str(tmp_path / "ck"), "--gradinit-iters", "2", "--max-source-positions", "1",
                    "--max-update", "1"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "gradinit: error: GradInit's batches: every one of the 150 training samples was skipped" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ranks" not in proc.stderr


def test_batch_size_without_token_budget_is_refused_when_parsed(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["/nonexistent-data", "--task", "language_modeling", "--arch", "transformer_lm", "--batch-size", "8",
               "--gradinit-iters", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --gradinit-max-tokens: GradInit draws batches of a number of tokens" in err
    # with a GradInit budget of its own, or GradInit off, the same line parses
    parse(["/nonexistent-data", "--task", "language_modeling", "--arch", "transformer_lm", "--batch-size", "8",
           "--gradinit-iters", "2", "--gradinit-max-tokens", "512"])
    parse(["/nonexistent-data", "--task", "language_modeling", "--arch", "transformer_lm", "--batch-size", "8"])


def test_legacy_task_refuses_gradinit_when_parsed(capsys):
    base = ["/nonexistent-data", "--task", "multilingual_translation", "--arch", "multilingual_transformer",
            "--lang-pairs", "de-en"]
    parse(base)  # unchanged without --gradinit-*
    with pytest.raises(SystemExit) as e:
        parse(base + ["--gradinit-iters", "2", "--max-tokens", "100"])
    assert e.value.code == 2
    assert "declares its options with add_args (no dataclass config)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the training monitor needs the plugin's task hooks too
        parse(base + ["--gradinit-monitor-interval", "10"])
    assert e.value.code == 2
    assert "declares its options with add_args (no dataclass config)" in capsys.readouterr().err


def test_tasks_registered_later_are_served():
    from dataclasses import dataclass

    from fairseq.dataclass import FairseqDataclass
    from fairseq.tasks import TASK_REGISTRY, FairseqTask, register_task

    @dataclass
    class LateConfig(FairseqDataclass):
        pass

    @register_task("gradinit_test_late_task", dataclass=LateConfig)
    class GradInitTestLateTask(FairseqTask):
        pass

    served = TASK_REGISTRY["gradinit_test_late_task"]
    assert issubclass(served, GradInitTestLateTask) and issubclass(served, GradInitTaskMixin)
    assert "gradinit_iters" in getattr(served, "__dataclass").__dataclass_fields__


def test_admin_profiling_on_a_tiny_batch_warns(mt_data, tmp_path, caplog):
    from fairseq import tasks, utils

    from fairseq_gradinit.fairseq_plugin.models.wskip import admin_profile_if_requested

    argv = [str(mt_data), "--task", "translation",
            *["transformer_wskip_iwslt_de_en" if a == "transformer_iwslt_de_en" else a for a in TINY_MT],
            "--criterion", "cross_entropy", "--wskip-init", "admin", "--max-tokens", "16",
            "--save-dir", str(tmp_path / "ck")]
    cfg = convert_namespace_to_omegaconf(parse(argv))
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    caplog.set_level("INFO")
    assert admin_profile_if_requested(model, task)
    assert "Admin profiling used one batch of only" in caplog.text
    assert (tmp_path / "ck" / "wskip_admin.json").is_file()


def test_adapter_import_graph_has_no_cycle_and_no_private_imports():
    import ast

    pkg = REPO / "fairseq_gradinit" / "fairseq_plugin"
    modules = {p.stem: p for p in pkg.glob("*.py")}
    edges, private = {}, []
    for name, path in modules.items():
        edges[name] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                target = (node.module or "").split(".")[0]
                targets = [target] if target else [a.name for a in node.names]
                edges[name].update(t for t in targets if t in modules and t != name)
                private += [f"{name} imports {a.name}" for a in node.names
                            if target and a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, private

    state = {}

    def visit(n, path):
        state[n] = "open"
        for m in sorted(edges[n]):
            assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
            if m not in state:
                visit(m, path + [m])
        state[n] = "done"

    for n in sorted(edges):
        if n not in state:
            visit(n, [n])
