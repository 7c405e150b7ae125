"""The stored timing of the BLEU step (``benchmarks/results/bleu_decode_cpu.json``) compares the in-process
decode with the former fairseq-generate subprocess on one checkpoint: the same scores on the same sentences,
and the in-process decode at least as fast."""
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_in_process_decode_scores_the_same_and_is_at_least_as_fast():
    record = json.loads((REPO / "benchmarks" / "results" / "bleu_decode_cpu.json").read_text(encoding="utf-8"))
    assert record["device"] == "cpu" and record["checkpoint"] and record["data"]
    cases = {c["name"]: c for c in record["cases"]}
    assert set(cases) == {"in-process", "subprocess"}
    inproc, sub = cases["in-process"], cases["subprocess"]
    assert (inproc["path"], sub["path"], inproc["at_once"], sub["at_once"]) == ("in-process", "subprocess", 1, 1)
    (a,), (b,) = inproc["decodes"], sub["decodes"]
    assert a["returncode"] == b["returncode"] == 0
    assert a["n_sentences"] == b["n_sentences"] > 1000
    assert (a["bleu"], a["signature"], a["fairseq_bleu"]) == (b["bleu"], b["signature"], b["fairseq_bleu"])
    assert a["wall_s"] <= b["wall_s"] and inproc["wall_s"] <= sub["wall_s"]
