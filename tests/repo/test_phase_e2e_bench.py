"""benchmarks/bench_phase_e2e.py --tiny: fairseq-train with the plugin in this process, every kind of
iteration measured, and its JSON, Markdown and README table."""
import json
import math

import pytest

pytest.importorskip("fairseq")


def _bench():
    import bench_phase_e2e  # benchmarks/ is on pytest's pythonpath

    return bench_phase_e2e


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_tiny_run_measures_every_kind_against_the_updates_of_the_same_run(tmp_path):
    bench = _bench()
    args = bench.get_args_parser().parse_args(["--tiny", "--device", "cpu", "--out", str(tmp_path / "out"),
                                               "--work-dir", str(tmp_path / "work")])
    report = bench.main(args)
    assert json.loads((tmp_path / "out" / "phase_e2e_cpu_tiny.json").read_text()) == json.loads(json.dumps(report))
    plan = bench.schedule(args)
    timed = bench.schedule(args, tail=False)
    # The forced schedule is what the run did: every iteration's branch, and gradinit.json's counts.
    its = report["per_iteration"]
    assert [e["kind"][0].upper() for e in its] == plan
    assert report["gradinit_json"]["iterations"] == len(plan)
    assert report["gradinit_json"]["num_objective"] == plan.count("O")
    assert [e["profiled"] for e in its] == [i >= len(timed) for i in range(len(plan))]
    assert report["iterations"] == len(timed)
    for e in its:
        assert e["kind"] != "constraint_after_objective" or e["previous"] == "objective"
        assert e["tokens_s"] > 0 and e["tokens_s_tilde"] > 0
        # tokens processed: S and S~ for an objective iteration, S for a constraint iteration
        want = e["tokens_s"] + (e["tokens_s_tilde"] if e["kind"] == "objective" else 0)
        assert e["tokens"] == want
        # the engine's passes are inside its step
        assert 0 < e["forward_s"] + e["backward_s"] + e["bookkeeping_s"] <= e["step_s"] * 1.001 + 1e-4
    for kind in bench.KINDS:
        k = report["kinds"][kind]
        assert k["count"] >= 1
        for key in ("wall_s", "step_s", "wall_s_per_token", "per_token_ratio", "cpu_per_token_ratio",
                    "per_update_ratio"):
            assert _positive(k[key]), (kind, key)
        assert (k["tokens_s_tilde"] is not None) == (kind == "objective")
    assert report["objective_per_token_ratio"] == report["kinds"]["objective"]["per_token_ratio"]
    assert report["constraint_per_token_ratio"] == report["kinds"]["constraint"]["per_token_ratio"]
    u = report["update"]
    assert u["count"] == args.updates - args.warmup_updates - 1 and _positive(u["wall_s_per_token"])
    # the phase's extra work is timed, and the profiled iterations are left out of the phase
    s = report["sections_s"]
    assert s["health"] > 0 and s["fingerprint"] > 0 and s["snapshot"] > 0 and s["result_write"] > 0
    assert 0 < report["extra_share"] < 1 and report["phase_s"] < report["phase_s_with_profiled"]
    # one profile and one host-read count per kind: the engine reads the device once per iteration and
    # fairseq's model in each pass (two passes for an objective iteration, one for a reused graph)
    assert set(report["profiles"]) == set(report["host_reads"]) == set(bench.KINDS)
    assert all(p["aten_ops"] > 0 for p in report["profiles"].values())
    reads = {k: v["total"] for k, v in report["host_reads"].items()}
    assert reads["objective"] - 1 == 2 * (reads["constraint"] - 1) and reads["constraint"] >= 1
    assert reads["constraint_after_objective"] == reads["objective"]
    md = (tmp_path / "out" / "phase_e2e_cpu_tiny.md").read_text()
    for label in ("| training update |", "| objective iteration |", "| constraint iteration after a constraint",
                  "| constraint iteration after an objective", "of the phase"):
        assert md.count(label) == 1, label
    assert "DATA-BIN" in report["fairseq_train"] and "SAVE-DIR" in report["fairseq_train"]


@pytest.mark.parametrize("argv, message", [
    (["--updates", "1"], "--updates 1: give more than --warmup-updates"),
    (["--objective-iters", "-1"], "--objective-iters -1"),
    (["--objective-iters", "0", "--constraint-iters", "0", "--switch-iters", "0"], "no timed iteration"),
])
def test_bad_arguments_are_usage_errors(tmp_path, capsys, argv, message):
    bench = _bench()
    args = bench.get_args_parser().parse_args(["--out", str(tmp_path / "out"), *argv])
    with pytest.raises(SystemExit) as e:
        bench.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before any work
