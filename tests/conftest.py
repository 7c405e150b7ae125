import os

import pytest
import torch

# The repository root, tests/ and benchmarks/ are importable through pyproject.toml's
# [tool.pytest.ini_options] pythonpath.
pytest_plugins = ["strict_skips"]

# The test machine has very few cores shared with other jobs: keep PyTorch single-threaded, here and in the
# fairseq-train and script subprocesses the tests start (they inherit the environment). On a shared CPU, two
# threads per process wait on each other's cores (benchmarks/bench_threads.py measures it). An OMP_NUM_THREADS
# set by the caller is kept, in this process too, so that the suite's own thread cost can be measured.
os.environ.setdefault("OMP_NUM_THREADS", "1")
_threads = os.environ["OMP_NUM_THREADS"].split(",")[0].strip()
torch.set_num_threads(int(_threads) if _threads.isdigit() and int(_threads) > 0 else 1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A tiny data-bin of the repository's de-en corpus, built once per test session."""
    from fairseq_helpers import make_tiny_bin

    return make_tiny_bin(tmp_path_factory.mktemp("tinydata"), {"train": 300, "valid": 40, "test": 40}, 600)
