"""The CPU heap during a phase: with GRADINIT_HEAP_TUNING=1, freed memory kept mapped and returned after;
without it, or where the user set glibc's thresholds, glibc left alone."""
import os

import pytest
import torch

ON = {"GRADINIT_HEAP_TUNING": "1"}


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class FakeLibc:
    """mallopt and malloc_trim, recorded; ``fail`` holds the mallopt parameters that return 0."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 0 if param in self.fail else 1

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def fake_libc(monkeypatch):
    from fairseq_gradinit.core import heap

    libc = FakeLibc()
    monkeypatch.setattr(heap, "_glibc", lambda: libc)
    return libc


def _no_user_thresholds():
    from fairseq_gradinit.core.heap import _glibc, user_settings

    if _glibc() is None:
        pytest.skip("glibc only")
    if user_settings(os.environ):
        pytest.skip("this environment sets glibc's thresholds itself")


def test_freed_memory_stays_mapped_during_a_cpu_phase_and_goes_back_after():
    from fairseq_gradinit.core.heap import heap_kept

    _no_user_thresholds()
    mib = 2 ** 20
    with heap_kept(torch.device("cpu"), ON) as kept:
        base = _rss()
        x = torch.ones(200 * mib // 4)  # above any mmap threshold glibc sets by itself
        del x
        inside = _rss() - base
    after = _rss() - base
    assert kept and inside > 150 * mib and after < 50 * mib, (inside / mib, after / mib)
    with heap_kept(torch.device("meta"), ON) as kept:
        assert not kept


@pytest.mark.parametrize("phase", ["gradinit", "metainit"])
@pytest.mark.parametrize("tuning", [True, False])
def test_the_phases_keep_freed_memory_mapped_on_a_cpu_only_when_asked(phase, tuning, monkeypatch):
    from fairseq_gradinit.core import GradInitConfig, MetaInitConfig, gradinit, metainit

    _no_user_thresholds()
    if tuning:
        monkeypatch.setenv("GRADINIT_HEAP_TUNING", "1")
    else:
        monkeypatch.delenv("GRADINIT_HEAP_TUNING", raising=False)
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
    assert kept and after < 50 * mib, ([k / mib for k in kept], after / mib)
    if tuning:
        assert min(kept) > 150 * mib, [k / mib for k in kept]
    else:  # glibc's own policy: a 200 MiB block is mapped for itself and unmapped when freed
        assert max(kept) < 50 * mib, [k / mib for k in kept]


def test_the_thresholds_set_during_and_after_a_phase(fake_libc):
    """During: never trim, never mmap; after (also when the body raises): glibc's converged values,
    mmap 32 MiB and trim 64 MiB, then the free memory returned."""
    from fairseq_gradinit.core import heap

    with pytest.raises(RuntimeError, match="body"):
        with heap.heap_kept(torch.device("cpu"), ON) as kept:
            assert kept
            assert fake_libc.calls == [("mallopt", heap.M_TRIM_THRESHOLD, 2 ** 31 - 1),
                                       ("mallopt", heap.M_MMAP_THRESHOLD, 2 ** 31 - 1)]
            raise RuntimeError("body")
    assert fake_libc.calls[2:] == [("mallopt", heap.M_MMAP_THRESHOLD, 32 * 2 ** 20),
                                   ("mallopt", heap.M_TRIM_THRESHOLD, 64 * 2 ** 20), ("malloc_trim", 0)]


@pytest.mark.parametrize("environ", [
    {},
    {"GRADINIT_HEAP_TUNING": "0"},
    dict(ON, MALLOC_TRIM_THRESHOLD_="4294967296"),
    dict(ON, MALLOC_MMAP_THRESHOLD_="33554432"),
    dict(ON, GLIBC_TUNABLES="glibc.malloc.check=0:glibc.malloc.mmap_threshold=65536"),
])
def test_glibc_is_left_alone_by_default_and_where_the_user_set_its_thresholds(fake_libc, environ):
    from fairseq_gradinit.core import heap

    with heap.heap_kept(torch.device("cpu"), environ) as kept:
        pass
    assert not kept and fake_libc.calls == []


def test_a_failed_mallopt_is_not_taken_for_a_kept_heap(monkeypatch):
    """mallopt returns 0 when glibc refuses a value: a refused trim threshold changes nothing (and nothing is set
    back); a refused mmap threshold leaves the heap not kept, and the trim threshold is still set back."""
    from fairseq_gradinit.core import heap

    libc = FakeLibc(fail={heap.M_TRIM_THRESHOLD})
    monkeypatch.setattr(heap, "_glibc", lambda: libc)
    with heap.heap_kept(torch.device("cpu"), ON) as kept:
        pass
    assert not kept and libc.calls == [("mallopt", heap.M_TRIM_THRESHOLD, 2 ** 31 - 1)]

    libc = FakeLibc(fail={heap.M_MMAP_THRESHOLD})
    monkeypatch.setattr(heap, "_glibc", lambda: libc)
    with heap.heap_kept(torch.device("cpu"), ON) as kept:
        pass
    assert not kept and libc.calls[-2:] == [("mallopt", heap.M_TRIM_THRESHOLD, 64 * 2 ** 20), ("malloc_trim", 0)]
