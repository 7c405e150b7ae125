"""The per-layer GradInit report: core measurements against hand computations, and the fairseq script
end to end on a tiny Transformer (with a gradinit.json written by a real fairseq-train run)."""
import importlib.util
import json
import math

import pytest
import torch
from torch import nn

from fairseq_gradinit.core.norms_and_spread import ReportConfig, gradient_std, init_report

from fairseq_helpers import make_tiny_bin  # noqa: E402


class Tiny(nn.Module):
    """Dropout, a BatchNorm (buffers must survive), a tied weight and an all-zero bias."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(8, 6)
        nn.init.zeros_(self.fc2.bias)
        self.out = nn.Linear(6, 7, bias=False)
        self.out.weight = self.emb.weight  # tied

    def forward(self, x):
        h = self.emb(x).mean(1)
        return self.out(self.fc2(self.drop(torch.relu(self.bn(self.fc1(h))))))


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _batches(k=4, n=5):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 7, (n, 3), generator=g), torch.randint(0, 7, (n,), generator=g)) for _ in range(k)]


def _hand_std(model, name, batches, seed, train, what="std"):
    """Per-element sample std of one tensor's gradient over the batches, averaged (or, with
    what="mean_abs", the mean magnitude of the per-element mean gradient): a literal loop."""
    p = dict(model.named_parameters())[name]
    grads = []
    for b, batch in enumerate(batches):
        model.train(train)
        model.bn.train(True)
        model.bn.track_running_stats = False  # batch statistics, buffers untouched
        torch.manual_seed(seed + b)
        (g,) = torch.autograd.grad(_loss(model, batch), [p])
        grads.append(g.double())
    model.bn.track_running_stats = True
    stacked = torch.stack(grads)
    if what == "mean_abs":
        return stacked.mean(dim=0).abs().mean().item()
    return stacked.std(dim=0, unbiased=True).mean().item()


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_report_matches_hand_computation_and_scales_norms(mode):
    model = Tiny()
    batches = _batches()
    scales = {"emb.weight": 0.5, "fc1.weight": 2.0, "fc1.bias": 0.3, "bn.weight": 0.7, "fc2.weight": 0.1}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = init_report(model, scales, batches, _loss, ReportConfig(mode=mode, seed=11))

    # nothing of the model changed (weights, BatchNorm buffers, flags)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert model.training

    by_name = {t.name: t for t in report.tensors}
    assert set(by_name) == {"emb.weight", "fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "fc2.weight", "fc2.bias"}
    assert by_name["emb.weight"].aliases == ["out.weight"]  # tied tensor once, under its first name
    assert not by_name["fc2.bias"].scaled and by_name["fc2.bias"].scale == 1.0
    assert by_name["fc2.bias"].norm_before == 0.0
    for t in report.tensors:
        assert t.norm_after == pytest.approx(t.scale * t.norm_before, rel=1e-6, abs=1e-12), t.name
        assert t.mean_abs_after == pytest.approx(t.scale * t.mean_abs_before, rel=1e-6, abs=1e-12), t.name
        assert t.grad_std_before > 0 and t.grad_std_after > 0, t.name

    train = mode == "train"
    for name in ("fc1.weight", "emb.weight", "fc2.bias"):
        hand = _hand_std(model, name, batches, 11, train)
        assert by_name[name].grad_std_before == pytest.approx(hand, rel=1e-9), name
        mean_abs = _hand_std(model, name, batches, 11, train, what="mean_abs")
        assert by_name[name].grad_mean_abs_before == pytest.approx(mean_abs, rel=1e-9), name
    scaled = Tiny()
    scaled.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, value in scales.items():
            dict(scaled.named_parameters())[name].mul_(value)
    for name in ("fc1.weight", "bn.weight"):
        assert by_name[name].grad_std_after == pytest.approx(_hand_std(scaled, name, batches, 11, train), rel=1e-9)
    model.train()


def test_train_mode_sees_dropout_and_eval_mode_does_not():
    model = Tiny()
    batches = _batches(k=3)
    params = [model.fc1.weight]
    train1, _, _ = gradient_std(model, params, batches, _loss, mode="train", seed=1)
    train2, _, _ = gradient_std(model, params, batches, _loss, mode="train", seed=2)
    eval1, _, _ = gradient_std(model, params, batches, _loss, mode="eval", seed=1)
    eval2, _, _ = gradient_std(model, params, batches, _loss, mode="eval", seed=2)
    assert eval1 == eval2  # no randomness without dropout
    assert train1 != train2 and train1 != eval1  # the seed sets the dropout masks


def test_report_rejects_bad_input():
    model = Tiny()
    with pytest.raises(ValueError, match="at least 2 minibatches"):
        init_report(model, {}, _batches(k=1), _loss)
    with pytest.raises(ValueError, match="does not have"):
        init_report(model, {"nope.weight": 1.0}, _batches(), _loss)
    with pytest.raises(ValueError, match="not finite"):
        init_report(model, {"fc1.weight": float("nan")}, _batches(), _loss)
    with pytest.raises(ValueError, match="mode"):
        ReportConfig(mode="inference")


# --------------------------------------------------------------------------------------------
# fairseq: scripts/gradinit_report.py on a tiny Transformer
# --------------------------------------------------------------------------------------------

TINY = [
    "--task", "translation_gradinit", "--arch", "transformer_iwslt_de_en", "--encoder-layers", "2",
    "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--share-all-embeddings", "--dropout", "0.1",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "300",
    "--seed", "3", "--cpu", "--num-workers", "0",
]


@pytest.fixture(scope="module")
def gradinit_run(tmp_path_factory):
    """A tiny data-bin and the gradinit.json of a real fairseq-train run with GradInit on it."""
    pytest.importorskip("fairseq")
    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (registers the task)
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    root = tmp_path_factory.mktemp("report")
    make_tiny_bin(root, {"train": 200, "valid": 20, "test": 20}, 400)
    save = root / "ck"
    argv = [str(root / "bin"), *TINY, "--optimizer", "adam", "--lr", "0", "--max-update", "1",
            "--disable-validation", "--no-save", "--save-dir", str(save), "--no-progress-bar",
            "--gradinit-iters", "6", "--gradinit-eta", "1e-2", "--gradinit-lr", "0.1", "--gradinit-gamma", "1e6"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    distributed_utils.call_main(cfg, train.main)
    return root / "bin", save / "gradinit.json"


def _script():
    from fairseq_gradinit.tools import gradinit_report

    return gradinit_report


def test_report_script_end_to_end(gradinit_run, tmp_path, monkeypatch, capsys):
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None  # the [plot] extra
    data, gjson = gradinit_run
    saved = json.loads(gjson.read_text())
    script = _script()
    out = tmp_path / "rep" / "tiny"
    # --gradinit-iters is ignored: the report must not rerun GradInit on the rebuilt model
    rc = script.main(["--gradinit-json", str(gjson), "--out", str(out), "--batches", "3", "--",
                      str(data), *TINY, "--max-tokens", "150", "--gradinit-iters", "5"])
    assert rc == (0 if has_matplotlib else 2)  # without matplotlib: JSON only, exit status 2
    result = json.loads(out.with_suffix(".json").read_text())
    png = out.with_suffix(".png")
    assert not has_matplotlib or (png.is_file() and 0 < png.stat().st_size < 300_000)

    check = result["check_first_iteration"]
    assert check["done"] and check["consistent"], check  # the rebuilt model is the one GradInit ran on
    assert check["loss_s"] == pytest.approx(saved["history"][0]["loss_s"], rel=1e-5)
    # g held every trainable tensor (step_params 'all'): the check compares with that norm, and the norm
    # over the scaled tensors alone (without the all-zero biases) would not pass it
    rec = check["recorded_grad_norm"]
    assert check["step_params"] == saved["config"]["step_params"] == "all"
    assert check["rel_diff_grad_norm"] == pytest.approx(abs(check["grad_norm_all_tensors"] - rec) / rec)
    assert abs(check["grad_norm_scaled_tensors"] - rec) / rec > 1e-3
    from fairseq_gradinit.fairseq_plugin.analysis import per_layer as rep

    wrong = {**saved, "config": {**saved["config"], "step_params": "scaled"}}
    other = rep.check_first_iteration(rep.build_training_model([str(data), *TINY]), wrong)
    assert other["done"] and not other["consistent"] and other["rel_diff_grad_norm"] > 1e-3

    tensors = result["tensors"]
    names = [t["name"] for t in tensors]
    assert len(names) == len(set(names))
    assert set(saved["scales"]) <= set(names)  # every scaled tensor is reported
    for t in tensors:
        assert t["scale"] == pytest.approx(saved["scales"].get(t["name"], 1.0))
        assert t["norm_after"] == pytest.approx(t["scale"] * t["norm_before"], rel=1e-5, abs=1e-12), t["name"]
        assert t["grad_std_before"] >= 0 and math.isfinite(t["grad_std_after"])
    enc_q = [t for t in tensors if t["side"] == "encoder" and t["kind"] == "self_attn.q" and t["param"] == "weight"]
    assert [t["layer"] for t in enc_q] == [0, 1]
    emb = next(t for t in tensors if t["name"] == "encoder.embed_tokens.weight")
    assert set(emb["aliases"]) == {"decoder.embed_tokens.weight", "decoder.output_projection.weight"}
    # the paper's order: every encoder tensor before every decoder tensor
    sides = [t["side"] for t in tensors]
    assert sides.index("decoder") > max(i for i, s in enumerate(sides) if s == "encoder")
    group = result["groups"]["decoder.encoder_attn.v.weight"]
    assert group["count"] == 2 and group["layers"] == [0, 1]
    assert result["health"]["verdict"] == saved["health"]["verdict"]  # the report holds the health block too
    meta = result["meta"]
    assert meta["num_batches"] == 3 and meta["mode"] == "train" and len(meta["batch_tokens"]) == 3
    assert max(meta["batch_tokens"]) <= 150

    # without matplotlib: the JSON is still written, the PNG is not, and the message says what to do
    def no_matplotlib(*a, **k):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(rep, "plot_report", no_matplotlib)
    out2 = tmp_path / "rep2" / "tiny"
    rc = script.main(["--gradinit-json", str(gjson), "--out", str(out2), "--batches", "2", "--no-check", "--",
                      str(data), *TINY])
    assert rc == 2
    assert out2.with_suffix(".json").is_file() and not out2.with_suffix(".png").exists()
    assert "pip install matplotlib" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.split_argv(["--gradinit-json", str(gjson)])  # fairseq arguments go after '--'
    # a --gradinit-json that cannot be read is an error message and exit status 1, not a traceback
    assert script.main(["--gradinit-json", str(tmp_path), "--out", str(tmp_path / "x"), "--", str(data), *TINY]) == 1


def test_transformer_place():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.features.groups import TensorPlace, transformer_place

    assert transformer_place("decoder.layers.3.encoder_attn.v_proj.weight") == TensorPlace("decoder", 3, "encoder_attn.v", "weight")
    assert transformer_place("encoder.layers.0.fc1.bias") == TensorPlace("encoder", 0, "fc1", "bias")
    assert transformer_place("encoder.layers.5.final_layer_norm.weight").kind == "final_layer_norm"
    assert transformer_place("encoder.embed_tokens.weight") == TensorPlace("encoder", None, "embed_tokens", "weight")
    assert transformer_place("decoder.layers.1.omega_ffn") == TensorPlace("decoder", 1, "omega_ffn", "parameter")


def test_report_script_writes_the_health_block_the_plugin_stored(gradinit_run, tmp_path):
    """--health-only draws GradInit's last S batch again: the same block as the plugin's, measured anew."""
    data, gjson = gradinit_run
    saved = json.loads(gjson.read_text())
    stored = saved["health"]
    assert stored["verdict"] in ("ok", "degenerate") and stored["norms"], stored
    out = tmp_path / "h" / "tiny"
    rc = _script().main(["--gradinit-json", str(gjson), "--out", str(out), "--health-only", "--",
                         str(data), *TINY, "--max-tokens", "150"])
    assert rc == 0 and not out.with_suffix(".png").exists()
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result) == {"check_first_iteration", "health", "meta", "written_by"}
    health = result["health"]
    assert health["batch"] == stored["batch"]  # the same sentences (GradInit's max_tokens, not --max-tokens)
    assert (health["verdict"], health["reasons"], health["floor"]) == (stored["verdict"], stored["reasons"],
                                                                        stored["floor"])
    assert [n["name"] for n in health["norms"]] == [n["name"] for n in stored["norms"]]
    for mine, theirs in zip(health["norms"], stored["norms"]):
        for key in ("input_std_before", "gain_before", "input_std_after", "gain_after"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5), (mine["name"], key)
    # the script refuses contradictory flags as a usage error
    with pytest.raises(SystemExit) as e:
        _script().main(["--gradinit-json", str(gjson), "--out", str(out), "--health-only", "--no-health", "--",
                        str(data), *TINY])
    assert e.value.code == 2


def test_the_report_page_states_the_commands_options_and_defaults():
    """docs/gradinit-report.md: its option table is the parser's (names, defaults, choices), and every option
    of the command is on the page."""
    import re
    from pathlib import Path

    from fairseq_gradinit.tools import gradinit_report

    page = (Path(__file__).resolve().parents[2] / "docs" / "gradinit-report.md").read_text(encoding="utf-8")
    actions = {a.option_strings[0]: a for a in gradinit_report.build_parser()._actions if a.option_strings}
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(--[\w-]+)[^`]*` \| ([^|]+) \|", page,
                                                                                   flags=re.MULTILINE)}
    assert rows == {"--batches": "8", "--mode": "`train`", "--batch-seed": "fairseq's `--seed`",
                    "--health-only": "off", "--no-health": "off", "--title": "the `gradinit.json` path"}
    assert actions["--batches"].default == 8 and actions["--mode"].default == "train"
    assert actions["--mode"].choices == ["train", "eval"] and "`--mode train\\|eval`" in page
    assert actions["--batch-seed"].default is None and "default: the fairseq --seed" in actions["--batch-seed"].help
    assert actions["--title"].default is None and "default: the gradinit.json path" in actions["--title"].help
    assert all(actions[flag].default is False for flag in ("--health-only", "--no-health", "--no-check"))
    with pytest.raises(SystemExit):
        gradinit_report.build_parser().parse_args(["--gradinit-json", "g", "--out", "o", "--batches", "1"])
    assert "(at least 2)" in page
    named = set(re.findall(r"--[\w-]+", page))
    assert set(actions) - {"-h"} <= named, set(actions) - named
