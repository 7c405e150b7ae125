"""The CPU heap during a phase: freed memory kept mapped, returned after."""
import pytest
import torch


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_freed_memory_stays_mapped_during_a_cpu_phase_and_goes_back_after():
    from fairseq_gradinit.core.heap import _glibc, heap_kept

    if _glibc() is None:
        pytest.skip("glibc only")
    mib = 2 ** 20
    with heap_kept(torch.device("cpu")) as kept:
        base = _rss()
        x = torch.ones(200 * mib // 4)  # above any mmap threshold glibc sets by itself
        del x
        inside = _rss() - base
    after = _rss() - base
    assert kept and inside > 150 * mib and after < 50 * mib, (inside / mib, after / mib)
    with heap_kept(torch.device("meta")) as kept:
        assert not kept


@pytest.mark.parametrize("phase", ["gradinit", "metainit"])
def test_the_phases_keep_freed_memory_mapped_on_a_cpu(phase):
    from fairseq_gradinit.core import GradInitConfig, MetaInitConfig, gradinit, metainit
    from fairseq_gradinit.core.heap import _glibc

    if _glibc() is None:
        pytest.skip("glibc only")
    mib = 2 ** 20
    kept = []

    def loss_fn(model, batch):
        x = torch.ones(200 * mib // 4)
        del x
        kept.append(_rss() - start)
        return model(batch).pow(2).mean()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    batches = [torch.randn(5, 4) for _ in range(2)]
    start = _rss()
    if phase == "gradinit":
        gradinit(model, batches, loss_fn, GradInitConfig(eta=1e-3, gamma=1.0, iters=1))
    else:
        metainit(model, batches, loss_fn, MetaInitConfig(iters=1))
    x = torch.ones(200 * mib // 4)
    del x
    after = _rss() - start
    assert kept and min(kept) > 150 * mib and after < 50 * mib, ([k / mib for k in kept], after / mib)


def test_the_thresholds_set_during_and_after_a_phase(monkeypatch):
    """During: never trim, never mmap; after (also when the body raises): glibc's converged values,
    mmap 32 MiB and trim 64 MiB, then the free memory returned."""
    from fairseq_gradinit.core import heap

    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append(("mallopt", param, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("malloc_trim", pad))
            return 1

    monkeypatch.setattr(heap, "_glibc", lambda: FakeLibc())
    with pytest.raises(RuntimeError, match="body"):
        with heap.heap_kept(torch.device("cpu")):
            assert calls == [("mallopt", heap.M_TRIM_THRESHOLD, 2 ** 31 - 1), ("mallopt", heap.M_MMAP_THRESHOLD, 2 ** 31 - 1)]
            raise RuntimeError("body")
    assert calls[2:] == [("mallopt", heap.M_MMAP_THRESHOLD, 32 * 2 ** 20), ("mallopt", heap.M_TRIM_THRESHOLD, 64 * 2 ** 20),
                         ("malloc_trim", 0)]
