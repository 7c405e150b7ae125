"""gradinit-train-vision (scripts/train_vision.py) end to end on small synthetic data (Fashion-MNIST-shaped 1x28x28)."""
import csv
import gzip
import json
import math
import os
from pathlib import Path

import pytest
import torch

from fairseq_gradinit.tools.train_vision import cli as tv
from fairseq_gradinit.tools.train_vision import data as tv_data
from fairseq_gradinit.tools.train_vision.initialization import paper_tau
from fairseq_gradinit.tools.train_vision.loop import lr_at


def args_for(tmp_path, *extra):
    argv = ["--dataset", "synthetic", "--synthetic-train-size", "192", "--synthetic-test-size", "64",
            "--synthetic-shape", "1,28,28", "--model", "vgg19", "--no-bn", "--width", "0.0625",
            "--batch-size", "32", "--test-batch-size", "64", "--epochs", "1", "--workers", "0", "--threads", "1",
            "--output-dir", str(tmp_path / "run"), "--log-interval", "0", "--no-progress", *extra]
    return tv.get_args_parser().parse_args(argv)


def test_every_flag_has_help():
    parser = tv.get_args_parser()
    for action in parser._actions:
        if action.dest != "help":
            assert action.help and action.help.strip(), action.option_strings
    assert {"kaiming", "gradinit", "metainit", "warmup1", "const1"} == set(
        next(a for a in parser._actions if a.dest == "init").choices)


def test_defaults_follow_the_paper():
    a = tv.get_args_parser().parse_args([])
    assert (a.lr, a.momentum, a.wd, a.epochs, a.init) == (0.1, 0.9, 1e-4, 200, "kaiming")
    assert a.gradinit_overlap == 0.5 and a.gradinit_min_scale == 0.01 and a.gradinit_sgd_step == "normalized"
    assert a.gradinit_adam_state == "shared"
    assert paper_tau("resnet110", False) == 5e-2 and paper_tau("vgg19", True) == 1e-1


def test_lr_schedules():
    kw = dict(base_lr=0.1, steps_per_epoch=10, epochs=2)
    cos = [lr_at(s, init="kaiming", **kw) for s in range(20)]
    assert cos[0] == pytest.approx(0.1) and all(a >= b for a, b in zip(cos, cos[1:]))
    assert lr_at(20, init="kaiming", **kw) == pytest.approx(0.0, abs=1e-12)  # 0 after the last iteration
    warm = [lr_at(s, init="warmup1", **kw) for s in range(30)]
    assert warm[:10] == pytest.approx([0.01 * (i + 1) for i in range(10)])
    assert warm[10:] == pytest.approx(cos)
    const = [lr_at(s, init="const1", **kw) for s in range(30)]
    assert const[:10] == pytest.approx([0.1] * 10) and const[10:] == pytest.approx(cos)


def test_gradinit_run_logs_checkpoints_and_resume(tmp_path):
    log = tv.main(args_for(tmp_path, "--init", "gradinit", "--gradinit-lr", "0.01"))
    run = tmp_path / "run"
    assert (run / "log.json").is_file() and (run / "log.csv").is_file() and (run / "checkpoint.pt").is_file()
    saved = json.loads((run / "log.json").read_text())
    assert saved["init"]["method"] == "gradinit"
    assert saved["init"]["iterations"] == 5  # one pass over 6 batches of 32 = 5 pairs (S, S~)
    assert all(s >= 0.01 - 1e-7 for s in saved["init"]["scales"].values())
    assert saved["init"]["tau"] == 0.01
    assert saved["clip_grad_norm"] == 1.0 and saved["bn"] is False  # no BN: clipping at norm 1
    assert len(saved["epochs"]) == 1 and saved["acc_1"] == saved["epochs"][0]["test_acc"] == saved["acc_best"]
    assert saved["init_time_over_epoch"] > 0 and math.isfinite(saved["init_time_over_epoch"])
    assert saved["steps_per_epoch"] == 6 and log["acc_best"] == saved["acc_best"]
    rows = list(csv.DictReader((run / "log.csv").open()))
    assert len(rows) == 1 and rows[0]["phase"] == "cosine"

    # resume for a second epoch: the initialization is not run again
    log2 = tv.main(args_for(tmp_path, "--init", "gradinit", "--epochs", "2", "--resume", "auto"))
    assert [r["epoch"] for r in log2["epochs"]] == [1, 2]
    assert log2["resumed_from"][0]["epoch"] == 1
    assert log2["init"]["iterations"] == 5
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    assert ckpt["epoch"] == 2 and ckpt["step"] == 12


def test_metainit_run(tmp_path):
    log = tv.main(args_for(tmp_path, "--init", "metainit", "--metainit-iters", "2", "--metainit-batch-size", "8",
                           "--bn", "--limit-train-batches", "3", "--limit-test-batches", "1"))
    assert log["init"]["method"] == "metainit" and log["init"]["iterations"] == 2
    assert log["bn"] is True and log["clip_grad_norm"] == 0.0
    changed = [n for n, v in log["init"]["norms"].items() if abs(v - log["init"]["initial_norms"][n]) > 1e-6]
    assert changed
    assert json.loads((tmp_path / "run" / "log.json").read_text())["init_time_over_epoch"] > 0
    assert log["steps_per_epoch"] == 3


def test_warmup_baseline_adds_one_epoch(tmp_path):
    log = tv.main(args_for(tmp_path, "--init", "warmup1", "--limit-train-batches", "2", "--limit-test-batches", "1"))
    assert [r["phase"] for r in log["epochs"]] == ["warmup", "cosine"]
    assert log["acc_1"] == log["epochs"][1]["test_acc"] and log["acc_first_epoch"] == log["epochs"][0]["test_acc"]


def write_idx(path, arr):
    arr = torch.as_tensor(arr, dtype=torch.uint8)
    header = bytes([0, 0, 8, arr.dim()]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.numpy().tobytes())


def test_fashion_mnist_reader(tmp_path, monkeypatch):
    d = tmp_path / "fm"
    d.mkdir()
    imgs = torch.randint(0, 256, (12, 28, 28), dtype=torch.uint8)
    labels = torch.arange(12) % 10
    write_idx(d / "train-images-idx3-ubyte.gz", imgs)
    write_idx(d / "train-labels-idx1-ubyte.gz", labels)
    write_idx(d / "t10k-images-idx3-ubyte.gz", imgs[:4])
    write_idx(d / "t10k-labels-idx1-ubyte.gz", labels[:4])
    assert torch.equal(tv_data.read_idx(d / "train-images-idx3-ubyte.gz"), imgs)
    args = args_for(tmp_path)
    args.dataset, args.data_dir = "fashion-mnist", str(d)
    train, test, classes, channels, side = tv_data.build_datasets(args)
    assert (len(train), len(test), classes, channels, side) == (12, 4, 10, 1, 28)
    x, y = train[0]
    assert x.shape == (1, 28, 28) and int(y) == 0
    x, _ = test[1]
    torch.testing.assert_close(x[0], (imgs[1].float() / 255 - 0.2860) / 0.3530)

    monkeypatch.setattr(tv_data, "FASHION_MNIST_DIRS", ())
    args.data_dir = str(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        tv_data.build_datasets(args)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz").is_file(),
                    reason="optional: Debian package dataset-fashion-mnist not installed")
def test_installed_fashion_mnist_files():
    files = tv_data.find_fashion_mnist(None)
    labels = tv_data.read_idx(files["test_labels"])
    assert labels.shape == (10000,) and int(labels.max()) == 9


def load_bench():
    import bench_vision  # benchmarks/ is on pytest's pythonpath

    return bench_vision


@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow on CPU (profiler start-up); set RUN_SLOW=1")
def test_bench_vision_smoke(tmp_path):
    bench = load_bench()

    def alloc():
        a = torch.empty(1000, 1000)  # 4 MB
        b = torch.empty(500, 1000)  # + 2 MB: peak 6 MB
        del a
        return b

    peak = bench.cpu_step_peak(alloc)
    assert peak is None or peak == 6_000_000  # the CPU memory measurement is exact
    args = bench.get_args_parser().parse_args(
        ["--device", "cpu", "--models", "vgg19:bn", "--width", "0.0625", "--batch-size", "2", "--image-size", "8",
         "--repeats", "1", "--warmup", "0", "--threads", "1", "--fd", "--out", str(tmp_path / "bench")])
    report = bench.main(args)
    r = report["results"][0]
    assert r["bn"] is True and set(r["ratios"]) >= {"objective_time", "objective_memory", "constraint_time",
                                                    "constraint_fd_time"}
    assert r["constraint_fd"]["skipped"] == 0
    assert r["objective"]["skipped"] == 0 and r["train"]["time_s"] > 0
    if peak is not None:
        assert r["objective"]["peak_bytes"] > r["objective"]["resident_bytes"] > 0
    assert json.loads((tmp_path / "bench.json").read_text())["results"][0]["model"] == "vgg19"
    md = (tmp_path / "bench.md").read_text()
    assert md.count("| vgg19 | yes |") == 2  # main table and the finite-difference table


def test_scale_bookkeeping_stays_fused(tmp_path):
    """The per-iteration bookkeeping issues a handful of operators per tensor (15 before it was
    fused), which is what bounds small models on a GPU."""
    import count_bookkeeping_ops as mod  # benchmarks/ is on pytest's pythonpath

    args = mod.get_args_parser().parse_args(["--models", "vgg19:bn", "--out", str(tmp_path / "ops")])
    (row,) = mod.main(args)["results"]
    assert row["flat_buffer"] and row["tensors"] == 50  # 33 scaled + 17 all-zero BN biases in the step
    assert 0 < row["ops"] <= 7 * row["tensors"], row
    assert "| vgg19 | yes | 50 |" in (tmp_path / "ops.md").read_text()
