"""The package's commands: console scripts of setup.py, listed in the README, whose functions import from
the package; the scripts/ wrappers call the same functions; the study's BLEU step runs from the installed
package; no source file edits sys.path; the command modules keep their functions short."""
import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fairseq_gradinit
from fairseq_gradinit.tools.user_dir import user_dir
from lab.study.arms import Arm
from lab.study.plan import BLEU_MODULE, ArmPlan, StudyConfig
from lab.study.runner import bleu_arm_command
from lab.study.scheduler import subprocess_env

REPO = Path(__file__).resolve().parents[2]
# The whole package, the scripts and the benchmarks: no function over MAX_FUNCTION_LINES lines.
COMMAND_CODE = ("fairseq_gradinit", "lab", "scripts", "benchmarks")
MAX_FUNCTION_LINES = 80


def console_scripts() -> dict:
    """{command: "module:function"} from setup.py's entry_points, read without running setup.py."""
    for node in ast.walk(ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entries = ast.literal_eval(node.value)["console_scripts"]
            return dict((part.strip() for part in entry.split("=", 1)) for entry in entries)
    raise AssertionError("setup.py has no entry_points")


def readme_commands() -> dict:
    """{command: its scripts/ wrapper or None} of the README's list."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("<!-- commands:start -->", 1)[1].split("<!-- commands:end -->", 1)[0]
    items = re.findall(r"^- `(gradinit-[a-z-]+)`(?: \(`(scripts/\w+\.py)`\))?", section, flags=re.M)
    assert len(items) == len(section.strip().splitlines()), "a line of the README's command list is not a command"
    return {name: script or None for name, script in items}


def wrapped_function(path: Path):
    """``module:function`` that a scripts/ wrapper imports from the package, or None."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module.startswith("fairseq_gradinit."):
            return f"{node.module}:{node.names[0].name}"
    return None


def target(spec: str):
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def test_every_readme_command_is_a_console_script_with_an_importable_function():
    listed, scripts = readme_commands(), console_scripts()
    assert set(listed) == set(scripts), "README's command list and setup.py's console_scripts differ"
    for name, wrapper in listed.items():
        assert callable(target(scripts[name])), name
        if wrapper is not None:  # `python scripts/NAME.py` runs the same function
            assert wrapped_function(REPO / wrapper) == scripts[name], wrapper


def test_scripts_are_wrappers_of_the_console_scripts():
    """Each scripts/NAME.py that is a command imports and calls the function of its console script."""
    targets = set(console_scripts().values())
    wrapped = set()
    for path in sorted((REPO / "scripts").glob("*.py")):
        spec = wrapped_function(path)
        if spec in targets:
            wrapped.add(spec)
            assert len(path.read_text().splitlines()) < 12, f"{path.name} is more than a wrapper"
    assert targets - wrapped == {"fairseq_gradinit.tools.user_dir:run"}


def test_study_runs_its_bleu_step_from_the_installed_package(tmp_path):
    cfg = StudyConfig(data={"main": str(tmp_path)}, out=tmp_path, arms=(Arm("a", ()),), cpu=True)
    plan = ArmPlan(arm=Arm("a", ()), argv=[], data=str(tmp_path), save_dir=tmp_path / "a")
    cmd = bleu_arm_command(cfg, plan, tmp_path / "checkpoint_1_4.pt", tmp_path / "a" / "bleu.json",
                           time_limit=None, gen_args=())
    package = Path(fairseq_gradinit.__file__).resolve().parent
    assert cmd[:3] == [sys.executable, "-m", BLEU_MODULE]
    assert cmd[cmd.index("--user-dir") + 1] == str(package) == user_dir()
    assert subprocess_env(cfg)["PYTHONPATH"].split(os.pathsep)[0] == str(package.parent)
    # the module runs from any folder, the study's working folder included
    proc = subprocess.run([sys.executable, "-m", BLEU_MODULE, "--help"], cwd=tmp_path, env=subprocess_env(cfg),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--user-dir" in proc.stdout, proc.stderr
    with_script = StudyConfig(data=cfg.data, out=tmp_path, arms=cfg.arms, bleu_script=tmp_path / "bleu.py")
    assert bleu_arm_command(with_script, plan, tmp_path / "c.pt", tmp_path / "b.json", time_limit=None,
                            gen_args=())[:2] == [sys.executable, str(tmp_path / "bleu.py")]


def python_files():
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if not any(p.startswith(".") or p in ("build", "__pycache__") or p.endswith(".egg-info") for p in parts):
            yield path


def test_no_source_file_edits_sys_path():
    needles = ["sys.path." + verb for verb in ("insert", "append")]
    found = [f"{p.relative_to(REPO)}:{i}" for p in python_files()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if any(n in line for n in needles)]
    assert found == []


@pytest.mark.parametrize("folder", COMMAND_CODE)
def test_functions_are_short(folder):
    long = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_tests_and_code_name_behaviour_not_tracker_numbers():
    cited = re.compile(r"(?<!fairseq )\bissues?\s+#?\d", re.I)  # upstream projects' issues may be cited
    found = [f"{p.relative_to(REPO)}:{i}" for folder in ("tests", "fairseq_gradinit", "lab", "scripts", "benchmarks")
             for p in sorted((REPO / folder).rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if cited.search(line)]
    assert found == []


def test_the_lab_commands_are_not_installed():
    """The study runner and its table are the research lab's (`python -m lab.study`, `python -m lab.study_table`
    from a checkout): no console script and no scripts/ wrapper of them."""
    assert not [name for name in console_scripts() if name.startswith("gradinit-study")]
    assert not list((REPO / "scripts").glob("study*.py"))
    assert (REPO / "lab" / "study_table.py").is_file() and (REPO / "lab" / "study").is_dir()
