"""The training monitor (``--gradinit-monitor-interval``): records driven through a fairseq task's own
``train_step``/``optimizer_step`` and fairseq's fp16 optimizer and loss scaler, on CPU, with non-finite
gradients injected."""
import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("fairseq")

from fairseq.models import BaseFairseqModel  # noqa: E402
from fairseq.optim.fp16_optimizer import MemoryEfficientFP16Optimizer  # noqa: E402
from fairseq.optim.sgd import SGD  # noqa: E402
from fairseq.tasks import FairseqTask  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from fairseq_gradinit.core.norm_stats import norm_input_stats  # noqa: E402
from fairseq_gradinit.fairseq_plugin.features import monitor  # noqa: E402
from fairseq_gradinit.fairseq_plugin.registration.hook import GradInitTaskMixin  # noqa: E402
from fairseq_gradinit.fairseq_plugin.features.monitor import (  # noqa: E402
    MONITOR_JSONL, group_of, training_weights,
)
from fairseq_gradinit.fairseq_plugin.settings.validation import monitor_option_error  # noqa: E402

VOCAB, DIM = 11, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)
        self.final_layer_norm = nn.LayerNorm(DIM)

    def forward(self, x):
        return self.final_layer_norm(x + self.fc2(F.dropout(F.relu(self.fc1(x)), 0.3, self.training)))


class Tiny(BaseFairseqModel):
    """Parameter names as a fairseq Transformer's: encoder/decoder, layers.N.fc1, final_layer_norm."""

    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.Module(), nn.Module()
        self.encoder.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.encoder.layers = nn.ModuleList([Block(), Block()])
        self.decoder.layers = nn.ModuleList([Block()])
        self.decoder.output_projection = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, src_tokens):
        x = self.encoder.embed_tokens(src_tokens)
        for layer in [*self.encoder.layers, *self.decoder.layers]:
            x = layer(x)
        return self.decoder.output_projection(x)


def criterion(model, sample):
    logits = model(**sample["net_input"])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), sample["target"].reshape(-1), reduction="sum")
    return loss, sample["ntokens"], {}


class MonitoredTask(GradInitTaskMixin, FairseqTask):
    pass


def make_task(save_dir, interval=2):
    return MonitoredTask(SimpleNamespace(gradinit_monitor_interval=interval, gradinit_save_dir=str(save_dir),
                                         gradinit_seed=1, gradinit_tied_embeddings="shared"))


def sample_batch(seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (4, 5), generator=g)
    return {"net_input": {"src_tokens": tokens}, "target": tokens.roll(1, dims=1), "ntokens": 20, "nsentences": 4}


def fp16_optimizer(params, *, init_scale=128.0, min_loss_scale=1e-4):
    """fairseq's MemoryEfficientFP16Optimizer (dynamic loss scaling) around fairseq's SGD; it runs on
    CPU with fp32 weights, the loss scaling arithmetic is the same."""
    ocfg = OmegaConf.create({"lr": [0.05], "momentum": 0.0, "weight_decay": 0.0})
    cfg = OmegaConf.create({
        "optimizer": ocfg, "optimization": {"update_freq": [1]}, "distributed_training": {"distributed_world_size": 1},
        "common": {"fp16_scale_window": None, "fp16_init_scale": init_scale, "fp16_scale_tolerance": 0.0,
                   "threshold_loss_scale": None, "min_loss_scale": min_loss_scale, "bf16": False,
                   "model_parallel_size": 1}})
    return MemoryEfficientFP16Optimizer(cfg, params, SGD(ocfg, params), allow_unsupported=True)


def trainer_step(task, model, optimizer, sample, update):
    """What fairseq's Trainer.train_step does around the task (its overflow branch needs CUDA)."""
    optimizer.zero_grad()
    model.train()
    task.train_step(sample, model, criterion, optimizer, update)
    optimizer.multiply_grads(1.0 / sample["ntokens"])
    try:
        norm = optimizer.clip_grad_norm(0.0)
        if not torch.isfinite(norm):
            raise FloatingPointError("gradients are Nan/Inf")
        task.optimizer_step(optimizer, model, update)
    except OverflowError:
        optimizer.zero_grad()
        return update
    return update + 1


def records(save_dir, *, validations=False):
    """The monitor's records; its per-validation source-gap records only with ``validations``."""
    out = [json.loads(line) for line in (save_dir / MONITOR_JSONL).read_text().splitlines()]
    return out if validations else [r for r in out if r["type"] != "validation"]


def test_overflow_record_names_the_parameter_whose_gradient_is_not_finite(tmp_path):
    torch.manual_seed(0)
    model = Tiny()
    task = make_task(tmp_path)
    opt = fp16_optimizer(list(model.parameters()))
    target = model.decoder.layers[0].fc2.weight
    inject = {"on": False}
    target.register_hook(lambda g: torch.full_like(g, math.inf) if inject["on"] else g)

    update, steps = 0, 0
    while update < 4:
        inject["on"] = steps == 1
        update = trainer_step(task, model, opt, sample_batch(steps), update)
        steps += 1
    recs = records(tmp_path)
    assert [r["type"] for r in recs] == ["start", "overflow", "interval", "interval"]
    over = recs[1]
    assert over["update"] == 1 and over["error"] == "OverflowError"
    assert over["loss_scale"] == 128.0 and over["loss_scale_after"] == 64.0
    assert over["nonfinite"]["count"] == 1 and over["nonfinite"]["of"] == len(list(model.parameters()))
    assert over["nonfinite"]["first"] == {"param": "decoder.layers.0.fc2.weight", "module": "decoder.layers.0.fc2",
                                          "group": "decoder.0.fc2"}
    assert over["nonfinite"]["last"] == over["nonfinite"]["first"]
    first, second = recs[2], recs[3]
    assert (first["update"], first["overflows"], first["skipped_updates"], first["loss_scale"]) == (2, 1, 1, 64.0)
    assert (second["update"], second["overflows"], second["skipped_updates"], second["loss_scale"]) == (4, 0, 0, 64.0)
    assert recs[0]["loss_scale"] == 128.0 and recs[0]["fixed_batch"] == {"nsentences": 4, "ntokens": 20}

    # The last overflow fairseq allows: the scaler stops training at its minimum loss scale.
    opt.scaler.min_loss_scale = 40.0
    inject["on"] = True
    with pytest.raises(FloatingPointError):
        trainer_step(task, model, opt, sample_batch(9), update)
    last = records(tmp_path)[-1]
    assert last["type"] == "overflow" and last["error"] == "FloatingPointError" and last["update"] == 4
    assert last["nonfinite"]["first"]["param"] == "decoder.layers.0.fc2.weight"


def test_overflow_inside_a_layer_names_first_and_last_parameter_in_module_order(tmp_path):
    """An inf in the gradient of a layer's output reaches that layer's weights and everything below it:
    the last non-finite parameter in module order is where backward met it first."""
    torch.manual_seed(0)
    model = Tiny()
    task = make_task(tmp_path)
    opt = fp16_optimizer(list(model.parameters()))

    def poison_output_gradient(module, inputs, out):
        out.register_hook(lambda g: g * math.inf)

    model.encoder.layers[1].fc2.register_forward_hook(poison_output_gradient)
    trainer_step(task, model, opt, sample_batch(0), 0)
    over = records(tmp_path)[-1]
    assert over["type"] == "overflow"
    assert over["nonfinite"]["first"]["param"] == "encoder.embed_tokens.weight"
    assert over["nonfinite"]["last"]["module"] == "encoder.layers.1.fc2"
    assert over["nonfinite"]["count"] >= 5  # embedding, layer 0 and layer 1's fc1/fc2


def test_fp32_non_finite_norm_is_recorded_before_training_stops(tmp_path):
    """Without a loss scaler the optimizer returns the non-finite norm and fairseq stops the run."""
    model = Tiny()
    task = make_task(tmp_path)
    opt = SGD(OmegaConf.create({"lr": [0.05], "momentum": 0.0, "weight_decay": 0.0}), list(model.parameters()))
    model.encoder.layers[0].final_layer_norm.weight.register_hook(lambda g: g * math.nan)
    with pytest.raises(FloatingPointError):
        trainer_step(task, model, opt, sample_batch(0), 0)
    start, over = records(tmp_path)
    assert start["loss_scale"] is None and start["precision"] == "float32"
    assert over["error"] is None and over["grad_norm"] == "nan" and over["loss_scale"] is None
    assert over["nonfinite"]["first"]["group"] == "encoder.0.final_layer_norm"


def test_interval_record_matches_hand_computed_norms_ratios_and_layernorm_statistics(tmp_path):
    torch.manual_seed(0)
    model = Tiny()
    task = make_task(tmp_path, interval=3)
    opt = SGD(OmegaConf.create({"lr": [0.5], "momentum": 0.0, "weight_decay": 0.0}), list(model.parameters()))
    update = 0
    while update < 2:
        update = trainer_step(task, model, opt, sample_batch(update), update)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    update = trainer_step(task, model, opt, sample_batch(update), update)
    rec = records(tmp_path)[-1]
    assert rec["type"] == "interval" and rec["update"] == 3 and rec["overflows"] == 0 and rec["skipped_updates"] == 0

    for group in ("encoder.1.fc1", "decoder.0.final_layer_norm", "encoder.embed_tokens", "decoder.output_projection"):
        names = [n for n in before if group_of(n) == group]
        assert names
        w_before = math.sqrt(sum(before[n].pow(2).sum().item() for n in names))
        w_after = math.sqrt(sum(dict(model.named_parameters())[n].pow(2).sum().item() for n in names))
        delta = math.sqrt(sum((dict(model.named_parameters())[n] - before[n]).pow(2).sum().item() for n in names))
        assert rec["groups"][group]["weight_norm"] == pytest.approx(w_after, rel=1e-5)
        assert rec["groups"][group]["update_ratio"] == pytest.approx(delta / w_before, rel=1e-5)
    assert set(rec["groups"]) == {group_of(n) for n in before}

    fixed = sample_batch(0)  # the first batch the monitor saw
    model.eval()
    expected = norm_input_stats(model, lambda m: m(**fixed["net_input"]))
    model.train()
    assert set(rec["norms"]) == set(expected) == {
        "encoder.layers.0.final_layer_norm", "encoder.layers.1.final_layer_norm", "decoder.layers.0.final_layer_norm"}
    for name, s in expected.items():
        assert rec["norms"][name]["eval"]["input_std"] == pytest.approx(s.input_std, rel=1e-5)
        assert rec["norms"][name]["eval"]["gain"] == pytest.approx(s.gain, rel=1e-5)
        assert rec["norms"][name]["train"]["input_std"] != rec["norms"][name]["eval"]["input_std"]  # dropout on
    loss, size, _ = criterion(model.eval(), fixed)
    assert rec["fixed_batch_loss"]["eval"] == pytest.approx(loss.item() / size / math.log(2), rel=1e-5)
    s = rec["summary"]
    assert s["max_update_ratio"] == max(g["update_ratio"] for g in rec["groups"].values() if g["update_ratio"])
    assert rec["groups"][s["max_update_ratio_group"]]["update_ratio"] == s["max_update_ratio"]
    assert s["max_ln_gain_eval"] == max(n["eval"]["gain"] for n in rec["norms"].values())
    assert s["min_ln_input_std_train"] == min(n["train"]["input_std"] for n in rec["norms"].values())

    # The fixed-batch passes leave the training's random state alone: the step after a record draws
    # the same dropout masks as it would have without the monitor.
    torch.set_rng_state(rng)
    model.train()
    task.gradinit_monitor.fixed_batch_stats(model, opt)
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng)
    again = task.gradinit_monitor.fixed_batch_stats(model, opt)[0]
    assert again == task.gradinit_monitor.fixed_batch_stats(model, opt)[0]  # fixed dropout seed


def test_fp32_master_weights_of_the_fp16_optimizer_are_measured():
    model = Tiny()
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]) * 2  # a master copy that differs from the model
    optimizer = SimpleNamespace(fp16_params=params, fp32_params={0: nn.Parameter(flat)})
    weights, source = training_weights(optimizer, model)
    assert source == "fp32 master"
    named = dict(model.named_parameters())
    assert [n for n, _ in weights] == list(named)
    for n, t in weights:
        assert torch.equal(t, 2 * named[n].detach())
    optimizer = SimpleNamespace(fp16_params=params, fp32_params=[p.detach().double() for p in params])
    assert all(t.dtype == torch.float64 for _, t in training_weights(optimizer, model)[0])
    assert training_weights(SimpleNamespace(), model)[1] == "model"


def test_monitor_off_changes_nothing(tmp_path):
    model = Tiny()
    task = make_task(tmp_path, interval=0)
    assert task.gradinit_monitor is None
    opt = SGD(OmegaConf.create({"lr": [0.05], "momentum": 0.0, "weight_decay": 0.0}), list(model.parameters()))
    trainer_step(task, model, opt, sample_batch(0), 0)
    assert "clip_grad_norm" not in vars(opt)
    assert not (tmp_path / MONITOR_JSONL).exists()


def test_a_monitor_write_error_warns_once_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """A full disk under monitor.jsonl: the monitor never stops the run it watches."""
    import builtins
    import errno

    calls = []

    def disk_full(path, *args, **kwargs):
        if str(path).endswith(MONITOR_JSONL):
            calls.append(path)
            raise OSError(errno.ENOSPC, "No space left on device")
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(monitor, "open", disk_full, raising=False)  # the module's open, not the builtin
    torch.manual_seed(0)
    model = Tiny()
    task = make_task(tmp_path, interval=1)
    opt = SGD(OmegaConf.create({"lr": [0.05], "momentum": 0.0, "weight_decay": 0.0}), list(model.parameters()))
    caplog.set_level("WARNING")
    update = 0
    for step in range(4):
        update = trainer_step(task, model, opt, sample_batch(step), update)
    assert update == 4  # every update was trained
    assert len(calls) == 1  # after the first error the monitor writes no more
    assert [r.getMessage() for r in caplog.records] == [
        f"gradinit: WARNING: cannot write {tmp_path / MONITOR_JSONL} (No space left on device); the monitor writes no "
        "more records and training goes on. Free space (or fix the permissions) to monitor the next run"]


def test_overflow_records_are_capped_per_interval_and_all_overflows_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "MAX_OVERFLOW_RECORDS", 2)
    torch.manual_seed(0)
    model = Tiny()
    task = make_task(tmp_path, interval=1)
    opt = fp16_optimizer(list(model.parameters()), init_scale=2.0 ** 24)
    inject = {"on": True}
    model.encoder.layers[0].fc1.bias.register_hook(lambda g: g * math.inf if inject["on"] else g)
    for step in range(3):
        assert trainer_step(task, model, opt, sample_batch(step), 0) == 0
    inject["on"] = False
    assert trainer_step(task, model, opt, sample_batch(3), 0) == 1
    recs = records(tmp_path)
    assert [r["type"] for r in recs] == ["start", "overflow", "overflow", "interval"]
    assert (recs[-1]["overflows"], recs[-1]["overflows_recorded"], recs[-1]["skipped_updates"]) == (3, 2, 3)
    assert recs[1]["loss_scale"] == 2.0 ** 24 and recs[-1]["loss_scale"] == 2.0 ** 21  # exact, not rounded


def test_fixed_batch_passes_leave_batchnorm_statistics_alone(tmp_path):
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.LayerNorm(4))
    mon = monitor.TrainingMonitor(interval=1, path=str(tmp_path / MONITOR_JSONL))
    mon.fixed_batch = {"x": torch.randn(8, 4) * 3 + 1}
    mon.criterion = lambda m, s: (m(s["x"]).pow(2).sum(), 8, {})
    before = {k: v.clone() for k, v in net.state_dict().items()}
    norms, losses, attention, branches = mon.fixed_batch_stats(net, optimizer=None)
    assert attention == {} and branches == {}  # no Transformer layers
    assert set(norms) == {"1", "2"} and set(norms["1"]) == {"eval", "train"}
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_monitor_is_not_part_of_the_gradinit_fingerprint():
    from fairseq_gradinit.fairseq_plugin.settings.options import plugin_result_options

    assert "gradinit_monitor_interval" not in plugin_result_options()


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_monitor_interval_must_be_a_count(value):
    assert monitor_option_error(SimpleNamespace(gradinit_monitor_interval=value)).startswith(
        "argument --gradinit-monitor-interval: invalid value")
    assert monitor_option_error(SimpleNamespace(gradinit_monitor_interval=5)) is None


def test_negative_monitor_interval_is_an_argument_error(capsys):
    from fairseq import options

    import fairseq_gradinit.fairseq_plugin.registration.task  # noqa: F401  (serves fairseq's tasks)

    argv = ["/nonexistent-data", "--task", "translation", "--arch", "transformer_iwslt_de_en"]
    def parse(extra):
        return options.parse_args_and_arch(options.get_training_parser(), input_args=argv + extra)

    assert parse(["--gradinit-monitor-interval", "7"]).gradinit_monitor_interval == 7
    with pytest.raises(SystemExit) as e:
        parse(["--gradinit-monitor-interval", "-1"])
    assert e.value.code == 2
    assert "argument --gradinit-monitor-interval: invalid value -1" in capsys.readouterr().err


def test_docs_schema_lists_exactly_the_keys_of_each_record_type(tmp_path):
    """docs/monitor.md's three tables name every key of the start, overflow and interval records, and no other."""
    import re
    from pathlib import Path

    torch.manual_seed(0)
    model = Tiny()
    task = make_task(tmp_path)
    opt = fp16_optimizer(list(model.parameters()))
    inject = {"on": False}
    model.decoder.layers[0].fc2.weight.register_hook(lambda g: torch.full_like(g, math.inf) if inject["on"] else g)
    update, steps = 0, 0
    while update < 2:
        inject["on"] = steps == 1
        update = trainer_step(task, model, opt, sample_batch(steps), update)
        steps += 1
    seen = {}
    for rec in records(tmp_path):
        seen.setdefault(rec["type"], set()).update(k for k in rec if k != "type")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "monitor.md").read_text(encoding="utf-8")
    for kind in ("start", "overflow", "interval"):
        section = doc.split(f"**`{kind}`**", 1)[1].split("**`", 1)[0]
        documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
        assert documented == seen[kind], (kind, documented ^ seen[kind])


# ---- a tiny fairseq Transformer: where an overflow began, attention and branch statistics --------------
def tiny_transformer(layers=2, dim=16, heads=2, words=20):
    import argparse

    from fairseq.data import Dictionary
    from fairseq.models import transformer

    d = Dictionary()
    for i in range(words):
        d.add_symbol(f"w{i}")
    args = argparse.Namespace(encoder_layers=layers, decoder_layers=layers, encoder_embed_dim=dim,
                              decoder_embed_dim=dim, encoder_ffn_embed_dim=2 * dim, decoder_ffn_embed_dim=2 * dim,
                              encoder_attention_heads=heads, decoder_attention_heads=heads, dropout=0.1,
                              max_source_positions=256, max_target_positions=256)
    transformer.base_architecture(args)
    torch.manual_seed(0)
    return transformer.TransformerModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d)), d


def seq_batch(d, *, bsz=3, src_len=7, tgt_len=6, seed=0):
    """A translation batch: left-padded sources (the first sentence one token short), right-padded targets."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(d.nspecial, len(d), (bsz, src_len), generator=g)
    src[0, 0] = d.pad()
    tgt = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    tgt[-1, -1] = d.pad()
    prev = torch.cat([torch.full((bsz, 1), d.eos()), tgt[:, :-1]], dim=1)
    return {"net_input": {"src_tokens": src, "src_lengths": (src != d.pad()).sum(1), "prev_output_tokens": prev},
            "target": tgt, "ntokens": int((tgt != d.pad()).sum()), "nsentences": bsz}


def seq_criterion(model, sample):
    logits, _ = model(**sample["net_input"])
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), sample["target"].reshape(-1),
                           ignore_index=1, reduction="sum")
    return loss, sample["ntokens"], {}


def seq_step(task, model, optimizer, sample, update):
    optimizer.zero_grad()
    model.train()
    task.train_step(sample, model, seq_criterion, optimizer, update)
    try:
        optimizer.clip_grad_norm(0.0)
        task.optimizer_step(optimizer, model, update)
    except OverflowError:
        optimizer.zero_grad()
        return update
    return update + 1


def test_overflow_is_attributed_to_the_query_projection_it_began_in_not_to_parameter_order(tmp_path, monkeypatch):
    """A NaN injected into one decoder self-attention's query gradient spreads to every parameter
    upstream (the whole encoder, earlier in parameter order); the record names the q_proj, the lengths
    and, at a target length of 64, the fault's signature."""
    model, d = tiny_transformer()
    attn = model.decoder.layers[1].self_attn
    attn.skip_embed_dim_check = True  # fairseq's own projections instead of torch's fused call: q_proj runs as a module
    inject = {"on": False}

    def poison(module, inputs, out):
        if inject["on"]:  # on q_proj's own output; the module returns a copy, which fairseq scales in place
            out.register_hook(lambda g: g.index_fill(0, torch.tensor([1]), math.nan))
            return out * 1.0

    attn.q_proj.register_forward_hook(poison)
    monkeypatch.setattr(monitor, "cudnn_attention_affected", lambda precision, device, guard: True)
    task = make_task(tmp_path, interval=100)
    opt = fp16_optimizer(list(model.parameters()))
    update = seq_step(task, model, opt, seq_batch(d, seed=0), 0)
    for tgt_len in (64, 65):
        inject["on"] = True
        assert seq_step(task, model, opt, seq_batch(d, src_len=9, tgt_len=tgt_len, seed=tgt_len), update) == update
    first, second = [r for r in records(tmp_path) if r["type"] == "overflow"]
    nf = first["nonfinite"]
    assert nf["born_in"]["module"] == "decoder.layers.1.self_attn.q_proj"
    assert nf["born_in"]["group"] == "decoder.1.self_attn.q"
    assert nf["first"]["module"].startswith("encoder.")  # parameter order names where the NaN ended
    names = [n for n, _ in model.named_parameters()]
    assert names.index(nf["first"]["param"]) < names.index(nf["born_in"]["param"])
    assert first["lengths"] == [{"source": 9, "target": 64}]
    assert first["known_bug"] == {"q_proj_only": True, "half_precision": True, "length_64_mod_128": True,
                                  "affected_torch": True, "match": True}
    assert second["lengths"] == [{"source": 9, "target": 65}]
    assert second["known_bug"]["length_64_mod_128"] is False and second["known_bug"]["match"] is False


def test_an_overflow_born_outside_attention_has_no_signature_and_order_comes_from_backward(tmp_path):
    model, d = tiny_transformer()
    inject = {"on": False}

    def poison(module, inputs, out):
        if inject["on"]:
            out.register_hook(lambda g: g * math.inf)

    model.encoder.layers[0].fc2.register_forward_hook(poison)
    task = make_task(tmp_path, interval=100)
    opt = fp16_optimizer(list(model.parameters()))
    update = seq_step(task, model, opt, seq_batch(d, seed=0), 0)
    inject["on"] = True
    seq_step(task, model, opt, seq_batch(d, seed=1), update)
    (rec,) = [r for r in records(tmp_path) if r["type"] == "overflow"]
    assert rec["nonfinite"]["born_in"]["module"] == "encoder.layers.0.fc2"
    assert rec["known_bug"]["q_proj_only"] is False and rec["known_bug"]["match"] is False
    order = task.gradinit_monitor.backward_order  # the decoder's output layers come before the encoder
    assert order["decoder.layers.1.fc2.weight"] < order["decoder.layers.0.fc2.weight"] < \
        order["encoder.layers.1.fc2.weight"] < order["encoder.layers.0.fc2.weight"]


def test_attention_logits_match_fairseqs_own_attention():
    """Logits, masks and probabilities against fairseq's MultiheadAttention (its own path with
    before_softmax, and its returned per-head weights) for a decoder self-attention with a future mask
    and padding, and an encoder one with left padding."""
    from fairseq_gradinit.fairseq_plugin.features.monitor_stats import attention_logits, attention_summary

    model, d = tiny_transformer()
    model.eval()
    sample = seq_batch(d, src_len=7, tgt_len=6)
    x = torch.randn(6, 3, 16)
    pad = sample["target"].eq(d.pad())
    future = torch.triu(torch.full((6, 6), float("-inf")), 1)
    for attn, mask in ((model.decoder.layers[0].self_attn, future), (model.encoder.layers[1].self_attn, None)):
        attn.skip_embed_dim_check = True
        with torch.no_grad():
            ref_logits, _ = attn(x, x, x, key_padding_mask=pad, attn_mask=mask, before_softmax=True)
            _, ref_probs = attn(x, x, x, key_padding_mask=pad, attn_mask=mask, need_head_weights=True)
            logits, valid, rows = attention_logits(attn, x, x, pad, mask)
        assert torch.equal(valid, torch.isfinite(ref_logits))
        assert torch.allclose(logits[valid], ref_logits[valid], atol=1e-5)
        probs = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1).reshape(3, 2, 6, 6).transpose(0, 1)
        assert torch.allclose(probs, ref_probs, atol=1e-5)
        summary = attention_summary(logits, valid, rows)
        p = ref_probs.transpose(0, 1).reshape(6, 6, 6)[rows]
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()
        assert summary["entropy"] == pytest.approx(float(entropy), rel=1e-5)
        assert summary["max_logit"] == pytest.approx(float(ref_logits[valid].max()), rel=1e-5)
        assert rows.sum() == 2 * (6 * 3 - 1)  # the padded query of the last sentence, in both heads


def test_branch_ratio_is_the_branch_output_norm_over_the_residual():
    from fairseq_gradinit.fairseq_plugin.features.monitor_stats import recording_branches

    model, d = tiny_transformer()
    model.eval()
    layer = model.encoder.layers[0]
    x = torch.randn(7, 3, 16)
    with torch.no_grad():
        attn_out, _ = layer.self_attn(x, x, x, need_weights=False)
        after_attn = layer.self_attn_layer_norm(x + attn_out)
        ffn_out = layer.fc2(torch.relu(layer.fc1(after_attn)))
        with recording_branches(model) as out:
            layer(x, None)
    assert set(out) == {"encoder.layers.0"}
    assert out["encoder.layers.0"]["self_attn"] == pytest.approx(float(attn_out.norm() / x.norm()), rel=1e-5)
    assert out["encoder.layers.0"]["ffn"] == pytest.approx(float(ffn_out.norm() / after_attn.norm()), rel=1e-5)
    assert "residual_connection" not in vars(layer)  # the wrapper is gone after the context


def test_eval_train_gap_warns_on_a_jump_once_per_step_up(tmp_path, caplog):
    mon = monitor.TrainingMonitor(interval=1, path=str(tmp_path / MONITOR_JSONL))
    caplog.set_level("INFO")
    gaps = [-0.2, -0.1, -0.25, 0.1, 0.2, 0.9, 1.0, 1.4, 0.3]
    out = [mon.eval_train_gap(100 * i, {"eval": 5.0 + g, "train": 5.0}) for i, g in enumerate(gaps)]
    assert [o["warning"] for o in out] == [False, False, False, False, True, True, False, True, False]
    assert out[0]["baseline"] is None and out[3]["baseline"] == pytest.approx(-0.25)
    warned = [r.getMessage() for r in caplog.records if "eval mode is breaking away" in r.getMessage()]
    assert len(warned) == 3 and "+0.200 bits at update 400" in warned[0]
    assert monitor.gap_warning(0.3, -0.2, None) and not monitor.gap_warning(-0.1, -0.6, None)


def test_interval_records_of_a_tiny_fairseq_run_hold_attention_branch_and_gap_statistics(tmp_path):
    from fairseq_helpers import make_tiny_bin
    from fairseq_train import TINY_MODEL, train_inprocess

    data = make_tiny_bin(tmp_path, {"train": 120, "valid": 20, "test": 20}, 300)
    save = tmp_path / "ck"
    train_inprocess([str(data), "--user-dir", "fairseq_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "4",
                     "--save-dir", str(save), "--gradinit-monitor-interval", "2"])
    start, *intervals = records(save)
    assert [r["update"] for r in intervals] == [2, 4]
    # the guard decides without GradInit too (here: fp32 on a CPU, nothing to do)
    guard = start["cudnn_sdpa_guard"]
    assert guard["mode"] == "auto" and guard["action"] == "kept" and guard["affected"] is False
    attentions = {f"{side}.layers.{i}.self_attn" for side in ("encoder", "decoder") for i in (0, 1)}
    for r in intervals:
        assert set(r["attention"]) == attentions
        for a in r["attention"].values():
            for mode in ("eval", "train"):
                # at most ln(longest sentence of the batch); heads of an untrained model attend almost evenly
                assert 0 < a[mode]["entropy"] < math.log(400) and math.isfinite(a[mode]["max_logit"])
        assert set(r["branches"]) == {f"{side}.layers.{i}" for side in ("encoder", "decoder") for i in (0, 1)}
        assert set(r["branches"]["encoder.layers.0"]) == {"self_attn", "ffn"}
        assert set(r["branches"]["decoder.layers.1"]) == {"self_attn", "encoder_attn", "ffn"}
        assert all(0 < v[m] < 100 for b in r["branches"].values() for v in b.values() for m in ("eval", "train"))
        losses = r["fixed_batch_loss"]
        assert r["eval_train_gap"]["gap"] == pytest.approx(losses["eval"] - losses["train"], abs=1e-4)
        assert r["eval_train_gap"]["warning"] is False
        s = r["summary"]
        assert s["max_attn_logit_eval_module"] in attentions and s["min_attn_entropy_train"] > 0
        assert s["max_branch_ratio_eval"] == max(v["eval"] for b in r["branches"].values() for v in b.values())
    assert intervals[0]["eval_train_gap"]["baseline"] is None
    assert intervals[1]["eval_train_gap"]["baseline"] == pytest.approx(intervals[0]["eval_train_gap"]["gap"], abs=1e-5)
    from fairseq_gradinit.tools import curves

    series = curves.parse_monitor_file(save / "monitor.jsonl")
    for key, path in (("monitor_eval_train_gap", ("eval_train_gap", "gap")),
                      ("monitor_max_attn_logit_train", ("summary", "max_attn_logit_train")),
                      ("monitor_min_attn_entropy_eval", ("summary", "min_attn_entropy_eval")),
                      ("monitor_max_branch_ratio_eval", ("summary", "max_branch_ratio_eval"))):
        assert series[key] == {r["update"]: r[path[0]][path[1]] for r in intervals}, key


def test_docs_name_every_curve_series_the_panels_and_the_warning_threshold():
    import re
    from pathlib import Path

    from fairseq_gradinit.tools import curves
    from lab.study.results import MONITOR_PANELS as STUDY_PANELS
    from fairseq_gradinit.tools.plot_curves import MONITOR_PANELS as PLOT_PANELS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "monitor.md").read_text(encoding="utf-8")
    section = doc.split("## In the study's curves", 1)[1]
    assert set(re.findall(r"`(monitor_\w+)`", section)) == set(curves.MONITOR_SERIES)
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"`curves.png` {words[len(STUDY_PANELS)]} more panels" in " ".join(section.split())
    assert f"validation loss with {words[len(PLOT_PANELS)]} more panels" in " ".join(section.split())
    assert f"at least {monitor.GAP_JUMP} bits above the" in " ".join(doc.split())


def test_a_failing_attention_statistic_is_recorded_and_the_pass_goes_on(monkeypatch):
    from fairseq_gradinit.fairseq_plugin.features import monitor_stats

    model, d = tiny_transformer()
    model.eval()

    def broken(*args):
        raise RuntimeError("no logits today")

    monkeypatch.setattr(monitor_stats, "attention_logits", broken)
    sample = seq_batch(d)
    with torch.no_grad(), monitor_stats.recording_attention(model) as out:
        logits, _ = model(**sample["net_input"])
    assert torch.isfinite(logits).all()
    assert out["encoder.layers.0.self_attn"] == {"error": "RuntimeError: no logits today"}
    assert len(out) == 4
