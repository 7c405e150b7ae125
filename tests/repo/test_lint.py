"""The linter and the import contracts of pyproject.toml hold on the whole repository: ``ruff check`` finds
nothing, and each ``lint-imports`` contract (the layers: a pure-PyTorch engine, a vision API without fairseq,
a library without the lab, the fairseq plugin's rooms) is kept. Both tools come with ``pip install -e ".[dev]"``."""

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11: pytest depends on tomli there
    import tomli as tomllib

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
CONTRACTS = [c["id"] for c in CONFIG["tool"]["importlinter"]["contracts"]]
#: Contracts the code does not keep yet, with what keeps them. xfail(strict): once the code keeps one, its
#: test fails until it is removed from here, so a kept contract stays kept.
PENDING = {}  # contract id -> why it is broken today (expected to fail until then)


def ruff():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]'")
    return [sys.executable, "-m", "ruff"]


def lint_imports():
    # The console script of the running interpreter's environment first (a virtualenv need not be on PATH).
    local = Path(sys.executable).parent / "lint-imports"
    found = str(local) if local.is_file() else shutil.which("lint-imports")
    if importlib.util.find_spec("importlinter") is None or found is None:
        pytest.skip("import-linter (lint-imports) is not installed: pip install -e '.[dev]'")
    return [found, "--no-cache", "--no-logo"]


def run(argv, cwd):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_in_the_repository():
    proc = run(ruff() + ["check", "--no-cache", "."], REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_uses_the_repository_rules(tmp_path):
    """The configuration is the one read: an unused import and a function over the complexity budget are
    reported."""
    budget = CONFIG["tool"]["ruff"]["lint"]["mccabe"]["max-complexity"]
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(budget + 1))
    code = f"import os\n\n\ndef f(x):\n{branches}    return -1\n"
    (tmp_path / "bad.py").write_text(code, encoding="utf-8")
    proc = run(
        ruff()
        + ["check", "--no-cache", "--config", str(REPO / "pyproject.toml"), "--output-format", "concise", "bad.py"],
        tmp_path,
    )
    assert proc.returncode == 1
    assert "F401" in proc.stdout and "C901" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    "contract",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=PENDING[c])) if c in PENDING else c
        for c in CONTRACTS
    ],
)
def test_import_contract_is_kept(contract):
    proc = run(lint_imports() + ["--contract", contract], REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_contract_catches_a_forbidden_import(tmp_path):
    """A copy of the library whose engine imports fairseq breaks the engine's contract."""
    lint = lint_imports()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("fairseq_gradinit", "lab"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    assert run(lint + ["--contract", "core-pure"], tmp_path).returncode == 0
    with open(tmp_path / "fairseq_gradinit" / "core" / "optim.py", "a", encoding="utf-8") as f:
        f.write("\nimport fairseq  # noqa: E402\n")
    proc = run(lint + ["--contract", "core-pure"], tmp_path)
    assert proc.returncode == 1
    assert "fairseq_gradinit.core.optim -> fairseq" in " ".join(proc.stdout.split()), proc.stdout


def dev_requirements():
    """setup.py's ``dev`` extra, read without running setup.py."""
    for node in ast.walk(ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return ast.literal_eval(node.value)["dev"]
    raise AssertionError("setup.py has no extras_require")


def test_the_install_page_names_the_dev_set_and_the_lint_commands():
    """docs/install.md names every package of the ``dev`` extra (pinned ones with their version) and the two lint
    commands this file runs."""
    page = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    requirements = dev_requirements()
    assert {"ruff", "import-linter"} <= {re.split(r"[<>=]", r)[0] for r in requirements}
    for requirement in requirements:
        shown = requirement if "==" in requirement else re.split(r"[<>=]", requirement)[0]
        assert shown in page, requirement
    assert "`ruff check .`" in page and "`lint-imports`" in page
