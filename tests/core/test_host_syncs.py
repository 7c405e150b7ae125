"""No avoidable work per GradInit iteration: one host sync (the branch decision), batches built
ahead by DevicePrefetcher and moved to the device once."""
import gc
import threading
import time

import pytest
import torch

from fairseq_gradinit.core import BatchPair, DevicePrefetcher, GradInit, GradInitConfig, gradinit_mode
from fairseq_gradinit.core.prefetch import move_to_device
from tiny_models import TinyTransformer, lm_loss, token_batches

from host_syncs import HostSyncCounter  # benchmarks/ is on pytest's pythonpath

#: gamma per iteration: objective, constraint (after an objective one), constraint (graph reused), objective
SCHEDULE = (1e9, 1e-9, 1e-9, 1e9)


def _steps(engine, model, batches, counter_device="cpu"):
    counts = []
    with gradinit_mode(model):
        for i, gamma in enumerate(SCHEDULE):
            engine.state.gamma = gamma
            with HostSyncCounter(counter_device) as syncs:
                rec = engine.step(BatchPair(batches[i], batches[i + 1]))
            assert rec.branch == ("objective" if gamma > 1 else "constraint")
            counts.append(dict(syncs.counts))
    engine.finalize()
    return counts


#: model passes per iteration of SCHEDULE: objective S and S~; constraint after objective: S twice;
#: reused graph: S once; objective
PASSES = (2, 2, 1, 2)
OPTIONS = [
    dict(),
    dict(constraint_grad="finite_difference"),
    dict(optimizer="sgd", sgd_step="normalized", scale_grad_clip=1.0),
    dict(adam_state="per_branch", reuse_graph=False, max_scale=3.0, scale_bounds=[("bias", 0, None)]),
    dict(precision="bf16"),
    dict(precision="tf32"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_one_host_sync_per_iteration(options):
    torch.manual_seed(0)
    model = TinyTransformer()
    engine = GradInit(model, lm_loss, GradInitConfig(eta=1e-3, gamma=1.0, **options))
    assert _steps(engine, model, token_batches(5)) == [{"tolist": 1}] * len(SCHEDULE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("options", OPTIONS)
def test_one_host_sync_per_iteration_on_cuda(options):
    """On CUDA the counter sees both the reads (.item(), .tolist()) and torch's reports of each
    synchronizing call; the engine adds one of each per iteration to what the loss passes do."""
    torch.manual_seed(0)
    model = TinyTransformer().cuda()
    batches = [b.cuda() for b in token_batches(5)]
    with gradinit_mode(model), HostSyncCounter("cuda") as model_syncs:
        lm_loss(model, batches[0]).backward()
    per_pass = dict(model_syncs.counts)
    model.zero_grad(set_to_none=True)
    engine = GradInit(model, lm_loss, GradInitConfig(eta=1e-3, gamma=1.0, **options))
    for n, c in zip(PASSES, _steps(engine, model, batches, "cuda")):
        expected = {k: n * v for k, v in per_pass.items()}
        expected["tolist"] = expected.get("tolist", 0) + 1
        expected["cuda_sync"] = expected.get("cuda_sync", 0) + 1
        assert {k: v for k, v in c.items() if v} == {k: v for k, v in expected.items() if v}


def test_a_progress_line_reads_the_device_once(caplog):
    torch.manual_seed(0)
    model = TinyTransformer()
    engine = GradInit(model, lm_loss, GradInitConfig(eta=1e-3, gamma=1e9))
    batches = token_batches(3)
    with gradinit_mode(model), caplog.at_level("INFO", logger="fairseq_gradinit"):
        engine.step(BatchPair(batches[0], batches[1]))
        for settled_only in (False, True):
            engine.step(BatchPair(batches[1], batches[2]))
            with HostSyncCounter() as syncs:
                engine.log_progress(2, 10, settled_only=settled_only)
            assert dict(syncs.counts) == {"tolist": 1}
    lines = [r.getMessage() for r in caplog.records if "gradinit iter" in r.getMessage()]
    assert len(lines) == 2 and "objective" in lines[0]
    a = list(engine.target.scaled.scales_dict().values())  # the learned scales only
    assert f"{min(a):.4g}/{sum(a) / len(a):.4g}/{max(a):.4g}" in lines[-1]


def test_sync_counter_sees_a_read_of_a_tensor_value():
    def loss_with_item(model, batch):
        loss = lm_loss(model, batch)
        float(loss)  # a host read the counter must catch
        return loss

    torch.manual_seed(0)
    model = TinyTransformer()
    engine = GradInit(model, loss_with_item, GradInitConfig(eta=1e-3, gamma=1.0))
    counts = _steps(engine, model, token_batches(5))
    assert counts[0] == {"tolist": 1, "_local_scalar_dense": 2}  # objective: S and S~


def test_flat_weight_buffer_is_built_once():
    torch.manual_seed(0)
    model = TinyTransformer()
    engine = GradInit(model, lm_loss, GradInitConfig(eta=1e-3, gamma=1.0))
    flat = engine.target.scaled._flat
    ptrs = (flat.data_ptr(), engine.state.alpha.data_ptr())
    _steps(engine, model, token_batches(5))
    assert engine.target.scaled._flat is flat and (flat.data_ptr(), engine.state.alpha.data_ptr()) == ptrs
    assert all(w.data_ptr() >= flat.data_ptr() for w in engine.target.scaled.W)  # views into it


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    from fairseq_helpers import make_tiny_bin

    pytest.importorskip("fairseq")
    return make_tiny_bin(tmp_path_factory.mktemp("syncs"), {"train": 300, "valid": 40, "test": 40}, nwords=200)


def test_plugin_iteration_adds_one_host_sync_to_the_model_passes(tiny_data):
    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (registers the tasks)
    from fairseq_gradinit.fairseq_plugin.data.loss import mean_loss_fn
    from fairseq_gradinit.fairseq_plugin.data.training import build_training_model
    from fairseq_train import TINY_TIED_MODEL as MODEL

    fm = build_training_model([str(tiny_data), "--task", "translation", *MODEL])
    loss_fn = mean_loss_fn(fm.criterion)
    pairs = fm.task.gradinit_pairs(fm.model, 600, 0.5, fm.device)
    assert isinstance(pairs, DevicePrefetcher)
    with pairs:
        batches = [next(pairs) for _ in range(3)]
    flat = [batches[0].s, batches[0].s_tilde, batches[1].s, batches[1].s_tilde, batches[2].s]
    with gradinit_mode(fm.model), HostSyncCounter() as model_syncs:
        loss_fn(fm.model, flat[0])
    per_pass = sum(model_syncs.counts.values())  # fairseq's own reads (e.g. "are there pads?")
    engine = GradInit(fm.model, loss_fn, GradInitConfig(eta=1e-3, gamma=1.0))
    counts = _steps(engine, fm.model, flat)
    for n, c in zip(PASSES, counts):
        assert c.pop("tolist") == 1
        assert sum(c.values()) == n * per_pass, (c, per_pass)


# -- DevicePrefetcher -------------------------------------------------------------------------


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "gradinit-prefetch"]


def _wait(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_prefetcher_builds_ahead_in_order_and_moves_each_item_once(monkeypatch):
    drawn = []

    def source():
        for i in range(6):
            drawn.append(i)
            yield BatchPair({"x": torch.full((2,), float(i))}, [torch.tensor([i])])

    moved = []
    import fairseq_gradinit.core.prefetch as prefetch

    def counting_move(batch, device, **kw):
        if isinstance(batch, BatchPair):  # not the nested calls
            moved.append(batch)
        return move_to_device(batch, device, **kw)

    monkeypatch.setattr(prefetch, "move_to_device", counting_move)
    with DevicePrefetcher(source(), "meta", depth=2, thread=True) as it:
        first = next(it)
        assert first.s["x"].device.type == "meta" and first.s_tilde[0].device.type == "meta"
        assert _wait(lambda: len(drawn) == 4)  # the one taken + 2 queued + 1 waiting to be queued
        time.sleep(0.05)
        assert len(drawn) == 4 and len(moved) == 1  # bounded: depth items ahead, none moved early
        rest = list(it)
    assert len(rest) == 5 and len(moved) == 6
    assert _wait(lambda: not _prefetch_threads())


def test_prefetcher_on_cpu_keeps_the_tensors_and_uses_no_thread():
    items = [BatchPair(torch.arange(3), torch.arange(2)) for _ in range(3)]
    before = len(_prefetch_threads())
    it = DevicePrefetcher(iter(items), "cpu")
    assert len(_prefetch_threads()) == before
    out = list(it)
    assert [o.s is i.s and o.s_tilde is i.s_tilde for o, i in zip(out, items)] == [True] * 3


def test_prefetcher_raises_the_source_error_in_order():
    def source():
        yield torch.zeros(1)
        yield torch.ones(1)
        raise OSError("disk gone")

    it = DevicePrefetcher(source(), "cpu", thread=True)
    assert next(it).item() == 0 and next(it).item() == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert _wait(lambda: not _prefetch_threads())


def test_prefetcher_thread_stops_when_closed_or_abandoned():
    def endless():
        while True:
            yield torch.zeros(1)

    it = DevicePrefetcher(endless(), "cpu", thread=True)
    next(it)
    it.close()
    assert _wait(lambda: not _prefetch_threads())
    with pytest.raises(StopIteration):
        next(it)
    it = DevicePrefetcher(endless(), "cpu", thread=True)
    next(it)
    del it
    gc.collect()
    assert _wait(lambda: not _prefetch_threads())
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)
