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
