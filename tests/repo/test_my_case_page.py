"""docs/my-case.md, what to run for each case: the README's first screen links it; its table gives every case a
run and links the evidence; its commands use real options: every fairseq-train command parses with fairseq and
the plugin, every ``--gradinit-*`` flag the page names is one of the plugin's options with a value that option
accepts, and the GradInit a command turns on resolves, through the plugin's own plan, to its defaults."""
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "my-case.md"
TEXT = PAGE.read_text(encoding="utf-8")
#: How many lines of the README a reader sees before scrolling.
FIRST_SCREEN = 40


def table_rows():
    """The cells of the page's (first) table, header and separator left out."""
    lines = TEXT.split("\n\n| ", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines]


def commands(program: str):
    """Each command of the page's bash blocks that starts with ``program``, as argv."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", TEXT, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [shlex.split(line, comments=True) for line in joined.splitlines() if line.startswith(program + " ")]
    return found


def test_the_readme_links_the_page_on_its_first_screen():
    head = "\n".join((REPO / "README.md").read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
    assert "(docs/my-case.md)" in head


def test_every_case_has_a_run_a_measurement_and_a_link_to_its_evidence():
    rows = table_rows()
    assert len(rows) >= 8
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^## (.+)$", TEXT, flags=re.M)}
    for case, run, measured, not_yet, evidence in rows:
        assert case and measured and not_yet, case
        assert set(re.findall(r"\]\(#([^)]+)\)", run)) <= anchors and re.search(r"\]\(#", run), case
        assert re.search(r"\]\((\.\./lab/record/|[\w-]+\.md)", evidence), case


def test_every_gradinit_flag_on_the_page_is_an_option_of_the_plugin_with_a_value_it_accepts():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.settings.options import ENGINE_OPTIONS, PLUGIN_OPTIONS

    specs = {spec.flag(): spec for spec in (*ENGINE_OPTIONS, *PLUGIN_OPTIONS)}
    named = re.findall(r"(--gradinit-[a-z-]+)(?:[ =]([^\s`|)]+))?", TEXT)
    assert named
    for flag, value in named:
        assert flag in specs, flag
        if value and not value.startswith("-") and not value.isupper():  # N, K: a placeholder in prose
            specs[flag].parse(value)


@pytest.fixture(scope="module")
def parsed():
    """{command's --save-dir: (argv, the plan the plugin resolves for it)} of each fairseq-train command."""
    pytest.importorskip("fairseq")
    from fairseq import options

    import fairseq_gradinit.fairseq_plugin  # noqa: F401
    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan

    out = {}
    for argv in commands("fairseq-train"):
        args = argv[1:]
        i = args.index("--user-dir")
        assert args[i + 1] == "fairseq_gradinit"
        del args[i:i + 2]
        ns = options.parse_args_and_arch(options.get_training_parser(), input_args=args)
        plan = build_plan(ns)
        assert plan.error is None, (args, plan.error)
        out[ns.save_dir] = (args, plan)
    return out


def test_every_fairseq_train_command_parses_and_its_gradinit_resolves_to_the_plugins_defaults(parsed):
    from fairseq_gradinit.core.config import first_step
    from fairseq_gradinit.fairseq_plugin.settings.options import ENGINE_OPTIONS

    assert len(parsed) >= 5
    with_gradinit = {d: (args, plan) for d, (args, plan) in parsed.items() if plan.enabled}
    assert with_gradinit, "no command of the page runs GradInit"
    for save_dir, (args, plan) in with_gradinit.items():
        # the only GradInit setting a command names is the iteration count: the rest are the plugin's defaults
        assert [a for a in args if a.startswith("--gradinit-")] == ["--gradinit-iters"], save_dir
        cfg, lr = plan.config, float(args[args.index("--lr") + 1])
        step = first_step(cfg.optimizer, lr, rule="fairseq")
        assert (cfg.eta, cfg.gamma) == (step.eta, step.gamma), save_dir
        assert cfg.iters == int(args[args.index("--gradinit-iters") + 1])
        defaults = {spec.name: spec.default for spec in ENGINE_OPTIONS}
        for name in ("adam_state", "min_scale", "overlap", "betas", "step_params"):
            assert getattr(cfg, name) == defaults[name], (save_dir, name)
