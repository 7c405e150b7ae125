"""The front page: the licence and citation agree with the package metadata, its numbers are the stored runs, and its
Python snippet runs as written."""
import ast
from pathlib import Path

import yaml

from fairseq_gradinit.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def _setup_keyword(name):
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup":
            for kw in node.keywords:
                if kw.arg == name:
                    return ast.literal_eval(kw.value)
    raise AssertionError(f"setup() has no {name}=")


def test_licence_is_mit_and_declared_in_setup():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert "WITHOUT WARRANTY OF ANY KIND" in text
    assert _setup_keyword("license") == "MIT"


def test_citation_file_names_the_paper_and_this_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == __version__ == _setup_keyword("version")
    assert cff["license"] == "MIT"
    paper = cff["preferred-citation"]
    assert paper["title"].startswith("GradInit: Learning to Initialize Neural Networks")
    assert paper["year"] == 2021
    assert [a["family-names"] for a in paper["authors"]] == ["Zhu", "Ni", "Xu", "Kong", "Huang", "Goldstein"]


def test_readme_bibtex_is_the_citation_file():
    import re

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))["preferred-citation"]
    bib = re.search(r"```bibtex\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S).group(1)
    fields = dict(re.findall(r"^\s*(\w+)\s*=\s*\{(.*)\},?$", bib, flags=re.M))
    assert fields["title"] == cff["title"]
    assert fields["year"] == str(cff["year"]) and fields["volume"] == str(cff["volume"])
    assert [a.split(",")[0].strip() for a in fields["author"].split(" and ")] == \
        [a["family-names"] for a in cff["authors"]]


def test_readme_front_page_numbers_are_the_stored_runs():
    """The front page's payoff, thread and GPU numbers are those of the stored result files."""
    import json

    readme = (ROOT / "README.md").read_text(encoding="utf-8").replace("\n", " ")
    docs = ROOT / "docs"
    runs = json.loads((docs / "compare-vision.json").read_text(encoding="utf-8"))
    # the accuracies, their range over the machines and the times are generated blocks (scripts/benchmark_tables.py)
    assert "**<!-- bench:compare_vision.payoff -->" in readme
    assert (runs["model"], runs["bn"], runs["width"], runs["steps"], runs["batch_size"], runs["gradinit_iters"]) == \
        ("vgg19", True, 0.25, 120, 128, 39)
    assert "120 steps of 128 images each" in readme and "after 39 GradInit iterations" in readme
    # the spread across machines, and the health line each demo ends with and why
    other = json.loads((docs / "compare-vision-kaiming-epyc.json").read_text(encoding="utf-8"))
    epyc = json.loads((docs / "compare-vision-epyc.json").read_text(encoding="utf-8"))
    assert epyc["conditions"]["cpu_model"] == other["conditions"]["cpu_model"]
    assert (epyc["model"], epyc["steps"], epyc["gradinit_iters"]) == (runs["model"], runs["steps"], runs["gradinit_iters"])
    # the Kaiming run there repeats the earlier measurement on that machine to the last digit
    assert epyc["runs"]["kaiming"]["test_acc"] == other["kaiming_log"]["epochs"][-1]["test_acc"]
    from fairseq_gradinit.core.health import HealthThresholds

    g = runs["runs"]["gradinit"]["gradinit_iterations"]
    assert g["constraint"] / (g["constraint"] + g["objective"]) <= HealthThresholds().max_constraint_share
    first = float(other["gradinit_first_line"].split("|g|_2 ")[1].split()[0])
    assert f"The GradInit run's health line says `health: OK`: ‖g‖ starts at {first:.1f} times γ = 1" in readme
    assert f"{g['objective']} of its {sum(g.values())} iterations on GradInit's objective" in readme
    health = " ".join((docs / "health.md").read_text(encoding="utf-8").split())
    assert g["constraint"] / sum(g.values()) < 0.25
    assert f"starts at {first:.1f} times γ and spends under a quarter of its iterations on constraint steps" in health
    # the translation quick start's step 2 as written, stored: its health line and branch counts
    qs = json.loads((ROOT / "lab" / "record" / "quickstart-translation" / "gradinit.json").read_text(encoding="utf-8"))
    assert (qs["iterations"], qs["num_objective"], qs["num_constraint"], qs["health"]["verdict"]) == (20, 20, 0, "ok")
    assert qs["config"]["gamma_init_factor"] == 2.0 and qs["config"]["lookahead_steps"] == 4
    assert "Its health line says `health: OK`: with Adam, γ is measured at the init" in readme
    assert "so all 20 iterations optimize the loss after four simulated steps" in " ".join(readme.split())
    install = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    size = readme.split("the environment we test with takes ")[1].split()[0]
    assert f"the virtual environment we test with takes {size} GB" in install
    # the thread speed-up and the GPU ResNet-110 sentence are generated blocks (scripts/benchmark_tables.py)
    assert "<!-- bench:quickstart.thread_speedup -->" in readme and "<!-- bench:fmnist_gpu.resnet110 -->" in readme


def test_readme_python_api_block_runs_as_written(monkeypatch, capsys):
    """The front page's Python snippet, run on a tiny model with its names bound: it runs with the vision API's
    defaults (the paper's CIFAR-10 setting), GradInit logs its progress at the level the snippet sets, and the
    result carries its health verdict."""
    import logging
    import re

    import torch

    from fairseq_gradinit.vision.api import GRADINIT_OPTIONS

    block = re.search(r"## Python API\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"),
                      flags=re.S).group(1)
    assert "gradinit(model, loader)" in block  # the defaults, through one public function
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
    scope = {"model": model, "loader": loader}
    # logging as a fresh script has it (pytest's capture handlers aside), restored afterwards
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    exec(compile(block, "README.md", "exec"), scope)
    result = scope["result"]
    assert len(result.history) == 3 and set(result.scales) <= {n for n, _ in model.named_parameters()}
    assert result.health is not None and result.health.verdict in ("ok", "degenerate")
    err = capsys.readouterr().err  # the snippet's basicConfig printed to stderr, as in a script
    assert "gradinit iter 1" in err and "gradinit: health: " in err
    assert "every 50 iterations and 30 s" in block
    assert (GRADINIT_OPTIONS["log_interval"].default, GRADINIT_OPTIONS["log_seconds"].default) == (50, 30.0)


def test_the_payoff_range_spans_the_stored_machines_and_a_run_is_compared_only_with_its_settings():
    from fairseq_gradinit.tools.compare_vision import STORED_RUNS, payoff_line, payoff_range, stored_results

    results = stored_results()
    assert len(results) == len(STORED_RUNS) == 2
    rng = payoff_range(results)
    accs = [(r["runs"]["kaiming"]["test_acc"], r["runs"]["gradinit"]["test_acc"]) for r in results]
    assert rng["kaiming"] == (min(k for k, _ in accs), max(k for k, _ in accs))
    assert rng["gain"] == (min(g - k for k, g in accs), max(g - k for k, g in accs))
    assert payoff_line(rng).startswith(f"Kaiming {rng['kaiming'][0]:.1f} to {rng['kaiming'][1]:.1f} %")
    assert payoff_range(results, like={**results[0], "steps": 60}) is None
    one = payoff_range(results[:1])
    assert f"GradInit {one['gradinit'][0]:.1f} %, " in payoff_line(one) and "(1 machine measured)" in payoff_line(one)
