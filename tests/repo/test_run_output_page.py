"""docs/run-output.md's example is the stored run's lines (lab/record/run-output-example.log), rendered by
scripts/run_output_example.py; tests/repo/test_fresh_clone.py checks that a fresh run prints the same shapes."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("run_output_example", REPO / "scripts" / "run_output_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_shows_the_stored_run_and_says_what_it_shows():
    example = load()
    page = (REPO / example.PAGE).read_text(encoding="utf-8")
    assert example.render(page) == page, "run python scripts/run_output_example.py --write"
    lines = [example.message(line) for line in example.plugin_lines(example.STORED.read_text(encoding="utf-8"))]
    assert lines and all(line.startswith("gradinit") for line in lines)
    summary = next(line for line in lines if line.startswith("gradinit: summary: "))
    # the sentences under the example are those of this run
    assert "gradinit: summary: 2 iterations (2 objective, 0 constraint, 0 skipped)" in summary
    assert "; health: OK;" in summary and "both iterations here are objective iterations" in " ".join(page.split())
    assert any("gamma = 2 x ||g||_1 at the init" in line for line in lines)
    took = next(line for line in lines if line.startswith("gradinit: 2 iterations (")).rsplit(" in ", 1)[1]
    assert f" skipped) in {took}; health: " in summary  # the phase's one time, in both lines
    # the sizes the page names are those of the fresh-clone test's run
    fresh = (REPO / "tests" / "repo" / "test_fresh_clone.py").read_text(encoding="utf-8")
    assert "max_update=3, gradinit_iters=2, max_tokens=512" in fresh and "encoder_layers=2, decoder_layers=2" in fresh
    assert "(2+2 layers,\n`--max-tokens 512`, 2 GradInit iterations, 3 updates" in page
