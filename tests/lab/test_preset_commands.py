"""Every preset's arm commands and GradInit cache keys stay what they were when recorded
(tests/data/preset-commands.json): a preset whose commands or keys changed would no longer reproduce
its documented runs, nor find the GradInit groups its earlier calls cached.

Regenerate deliberately (after a change that is meant to alter a preset) with
``PYTHONPATH=.:tests python tests/lab/test_preset_commands.py --write``; presets added later are recorded then."""
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
SNAPSHOT = HERE / "data" / "preset-commands.json"


def _normalize(argv, subs):
    out = []
    for token in argv:
        for old, new in subs:
            token = token.replace(old, new)
        out.append(token)
    return out


def preset_commands(root: Path, names=None) -> dict:
    """{preset: {arm: {"argv": normalized fairseq-train command, "group": cache key or None}}} for the
    presets ``names`` (default: all)."""
    from fairseq_helpers import make_tiny_bin, make_tiny_lm_bin

    from lab.study import plan as study_plan
    from lab.study.plan import StudyConfig
    from lab.study.presets import PRESETS

    for sub in ("tr", "lm"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    data = make_tiny_bin(root / "tr", {"train": 40, "valid": 8, "test": 8}, 100)
    lm = make_tiny_lm_bin(root / "lm", {"train": 40, "valid": 8, "test": 8}, 100)
    out = {}
    for preset in (PRESETS[n] for n in (names or PRESETS)):
        main = str(lm if preset.name == "lm" else data)
        files = {}
        for key in preset.files:
            path = root / f"{key}.json"
            path.write_text(json.dumps({"scales": {"encoder.embed_tokens.weight": 0.5}}))
            files[key] = str(path)
        cfg = StudyConfig(data={"main": main, "separate": main}, out=root / "out" / preset.name,
                          arms=tuple(preset.arms), base=preset.base, files=files, max_update=preset.max_update,
                          valid_every=preset.valid_every, save_every=preset.save_every)
        plans, groups = study_plan.plan_study(cfg)
        subs = [(str(root), "ROOT"), (sys.executable, "PYTHON"), (str(study_plan.PACKAGE_DIR), "PACKAGE")]
        out[preset.name] = {p.arm.name: {"argv": _normalize(study_plan.arm_command(cfg, p, groups), subs),
                                         "group": p.group} for p in plans}
    return out


def test_every_recorded_preset_keeps_its_commands_and_cache_keys(tmp_path):
    pytest.importorskip("fairseq")
    recorded = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    from lab.study.presets import PRESETS

    assert set(recorded) <= set(PRESETS), "a recorded preset was removed"
    now = preset_commands(tmp_path, tuple(recorded))
    for preset, arms in recorded.items():
        assert set(arms) <= set(now[preset]), (preset, "arms removed")
        for arm, want in arms.items():
            got = now[preset][arm]
            assert got["argv"] == want["argv"], (preset, arm)
            assert got["group"] == want["group"], (preset, arm, "cache key changed")


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        SNAPSHOT.write_text(json.dumps(preset_commands(Path(tmp)), indent=1, sort_keys=True) + "\n",
                            encoding="utf-8")
    print(f"wrote {SNAPSHOT}")  # noqa: T201
