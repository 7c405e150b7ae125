from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="fairseq-gradinit",
    version="0.5.0",
    description="GradInit: learning to initialize neural networks (fairseq plugin and PyTorch API)",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    packages=find_packages(include=["fairseq_gradinit", "fairseq_gradinit.*"]),
    install_requires=[
        "torch>=2.1",
        "numpy",
        "tqdm",
        "sacrebleu>=2",
        "sentencepiece",
    ],
    extras_require={
        # fairseq is an extra so that a user with fairseq from source does not get a second copy.
        # ve-fairseq installs the import package `fairseq` and works on Python 3.11/3.12.
        "fairseq": ["ve-fairseq>=0.12.3"],
        "vision": ["torchvision"],
        # PNG plots of scripts/plot_curves.py (JSON and Markdown need nothing extra).
        "plot": ["matplotlib"],
        # --wskip-init admin-closed-form calls admin-torch's rule when the package is installed.
        "admin": ["admin-torch==0.1.0"],
        # The tested set (Python 3.11/3.12, Linux x86_64): pinned so a fresh machine gets a
        # torch/torchvision pair that load together. On Linux PyPI's torch is the CUDA build; the README
        # says how to install the CPU build first. No torchaudio on PyPI matches torch 2.14 (ve-fairseq
        # pulls 2.11): python -m fairseq_gradinit.install_check reports it.
        # ruff and import-linter: the linter and the import contracts of pyproject.toml (tests/repo/test_lint.py).
        "dev": ["pytest>=7", "ve-fairseq==0.12.3", "torch==2.14.1", "torchvision==0.29.1", "admin-torch==0.1.0",
                "matplotlib", "ruff==0.17.6", "import-linter==2.17"],
    },
    entry_points={
        "console_scripts": [
            "gradinit-user-dir=fairseq_gradinit.tools.user_dir:run",
            "gradinit-prepare-corpus=fairseq_gradinit.tools.prepare_corpus:run",
            "gradinit-evaluate-bleu=fairseq_gradinit.tools.evaluate_bleu:run",
            "gradinit-report=fairseq_gradinit.tools.gradinit_report:run",
            "gradinit-valid-loss-modes=fairseq_gradinit.tools.valid_loss_modes:run",
            "gradinit-plot-curves=fairseq_gradinit.tools.plot_curves:run",
            "gradinit-train-vision=fairseq_gradinit.tools.train_vision.cli:run",
            "gradinit-compare-vision=fairseq_gradinit.tools.compare_vision:run",
            "gradinit-demo=fairseq_gradinit.tools.demo:run",
        ],
    },
)
