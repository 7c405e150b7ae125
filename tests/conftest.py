import os

import pytest
import torch

# The repository root, tests/ and benchmarks/ are importable through setup.cfg's [tool:pytest] pythonpath.
pytest_plugins = ["strict_skips"]

# The test machine has very few cores shared with other jobs: keep PyTorch single-threaded, here and in the
# fairseq-train and script subprocesses the tests start (they inherit the environment). On a shared CPU, two
# threads per process wait on each other's cores (benchmarks/bench_threads.py measures it).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
