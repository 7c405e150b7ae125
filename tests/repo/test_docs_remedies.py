"""docs/remedies.md: its commands parse with the plugin and its numbers hold (its tables are generated:
tests/repo/test_generated_docs.py)."""
import math
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "remedies.md").read_text(encoding="utf-8")


def doc_commands():
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", DOC, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        cmds += [shlex.split(line, comments=True) for line in joined.splitlines() if line.startswith("fairseq-train ")]
    return cmds


def test_every_flag_of_the_table_and_commands_parses_with_the_plugin():
    pytest.importorskip("fairseq")
    from fairseq import options

    import fairseq_gradinit.fairseq_plugin  # noqa: F401

    cmds = doc_commands()
    assert len(cmds) == 4
    table_flags = set(re.findall(r"^\| [^|]+ \| `(--gradinit-[a-z-]+)", DOC, flags=re.M))
    from fairseq_gradinit.fairseq_plugin.registration.task import TranslationGradInitConfig

    fields = {"--" + n.replace("_", "-") for n in TranslationGradInitConfig.__dataclass_fields__}
    assert len(table_flags) == 8 and table_flags <= fields
    for argv in cmds:
        args = argv[1:]
        i = args.index("--user-dir")
        del args[i:i + 2]
        if "--gradinit-init-file" in args:  # parsing reads the init file: give it one
            continue
        ns = options.parse_args_and_arch(options.get_training_parser(), input_args=args)
        assert ns.gradinit_iters == 780


def test_the_xavier_rms_range_and_the_adam_update_comparison():
    """Xavier-uniform weights of the d=512 transformer_iwslt_de_en have rms 0.03-0.044; at scale 0.01
    that is below one Adam update at lr 5e-4."""
    d, ffn = 512, 1024
    rms = lambda fan_in, fan_out, gain=1.0: gain * math.sqrt(2.0 / (fan_in + fan_out))  # noqa: E731
    values = [rms(d, d, 2 ** -0.5), rms(d, d), rms(d, ffn), d ** -0.5]  # q/k/v, out_proj, fc1/fc2, embeddings
    assert min(values) == pytest.approx(0.03125) and max(values) == pytest.approx(0.0442, abs=1e-4)
    assert 0.01 * max(values) < 5e-4
    assert "root-mean-square of 0.03–0.044" in DOC and "3–4.4e-4" in DOC


def test_the_floor_counts_of_the_collapsed_d512_scales():
    import json

    scales = json.loads((REPO / "tests" / "data" / "authors-d512-scales.json").read_text())["scales"]
    weights = {k: v for k, v in scales.items() if not k.endswith(".bias")}
    biases = {k: v for k, v in scales.items() if k.endswith(".bias")}
    assert len(weights) == 128 and len(biases) == 78
    assert sum(v <= 0.01 + 1e-6 for v in weights.values()) == 20
    assert sum(v <= 0.01 + 1e-6 for v in biases.values()) == 9
    assert "20 of its 128 weight tensors" in DOC and "9 of its 78 biases" in DOC


def test_the_health_page_quotes_the_measured_health_of_the_collapsed_scales():
    import json

    health = json.loads((REPO / "docs" / "health-authors-d512.json").read_text())["health"]
    page = (REPO / "docs" / "health.md").read_text(encoding="utf-8").replace("\n", " ")
    assert health["verdict"] == "degenerate" and health["floor"]["weights"]["count"] == 20
    assert "20 of the 128 weight tensors" in page


def test_the_only_remedy_that_is_a_default_is_the_one_that_beat_the_warmup_run():
    """Which remedy the defaults use (several simulated steps, four with Adam), and that none of the others the
    page names reached the warmup run's loss at update 800 on the testbed (their losses: docs/no-warmup.md's
    generated table, which the page links)."""
    pytest.importorskip("fairseq")
    from test_docs_no_warmup import curves_of_testbed

    from fairseq_gradinit.fairseq_plugin.settings.options import NO_WARMUP_LOOKAHEAD_STEPS

    curves = curves_of_testbed()
    at = {arm: curves[arm][800][0] for arm in ("warmup", "gi-ratio", "gi-floors", "gi-dropout", "gi-unstepped")}
    assert all(at[a] > at["warmup"] for a in at if a != "warmup")
    text = " ".join(DOC.split())
    assert NO_WARMUP_LOOKAHEAD_STEPS == 4 and "(with Adam, four, with γ measured at the init;" in text
    assert "none of the others reached the warmup run's" in text
    assert "no-warmup.md#cpu-testbed-d128-validation-loss" in text
