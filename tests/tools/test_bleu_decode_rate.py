"""scripts/evaluate_bleu.py measures its decode rate while fairseq-generate runs, projects the run's
length from it, stops at --time-limit, and decodes in fp16 only on a CUDA GPU."""
import json
import os
import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("fairseq")

from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


from fairseq_gradinit.tools import evaluate_bleu  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def untrained(tiny_data, tmp_path_factory):
    """An untrained tiny translation_gradinit model (one update at lr 0)."""
    save = tmp_path_factory.mktemp("rate-ckpt")
    train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "0", "--max-update", "1",
                     "--save-dir", str(save), "--no-save-optimizer-state"])
    return save / "checkpoint_last.pt"


def test_meter_projects_from_the_source_token_rate():
    meter = evaluate_bleu.DecodeMeter(4, [10, 10, 30, 50], chunk=2, t0=100.0)
    meter.log_line(103.0)  # start-up ends with the last log line before the first hypothesis
    meter.hypothesis(0, 104.0)
    assert not meter.measured
    meter.hypothesis(1, 105.0)
    assert meter.measured
    r = meter.report(105.0)
    # 20 source tokens in 2 s -> 10 tokens/s; 80 left -> 8 s more; 5 s have passed since the start
    assert r["startup_s"] == 3.0 and r["sentences_per_s"] == 1.0 and r["source_tokens_per_s"] == 10.0
    assert r["projected_total_s"] == 13.0
    bare = evaluate_bleu.DecodeMeter(4, None, chunk=2, t0=0.0)
    bare.hypothesis(0, 1.0)
    bare.hypothesis(1, 2.0)
    assert bare.report(2.0)["projected_total_s"] == 4.0  # by sentences when sizes are unknown


def test_source_sizes_read_from_the_mmap_index(tmp_path):
    import subprocess_bleu  # the former BLEU step's reader (benchmarks/ is on pytest's pythonpath)

    sizes = [3, 7, 5]
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + b"\x04" + struct.pack("<Q", 3) + struct.pack("<Q", 4)
    (tmp_path / "test.de-en.de.idx").write_bytes(header + struct.pack("<3i", *sizes) + b"\x00" * 24)
    (tmp_path / "test.de-en.en.idx").write_bytes(header + struct.pack("<3i", 9, 9, 9) + b"\x00" * 24)
    assert subprocess_bleu.source_sizes(tmp_path, "test") == sizes
    assert subprocess_bleu.source_sizes(tmp_path, "valid") is None


def test_fp16_and_gpu_batches_only_on_cuda(monkeypatch):
    from fairseq_gradinit.tools import bleu_decode

    args = evaluate_bleu.build_parser().parse_args(["data", "--path", "ck.pt", "--fp16"])
    monkeypatch.setattr(bleu_decode, "cuda_available", lambda: False)
    cuda, fp16, note = evaluate_bleu.decode_device(args.cpu, args.fp16)
    assert (cuda, fp16) == (False, False) and "fp32" in note
    cpu_cmd = evaluate_bleu.decode_config(args, [], cuda=cuda, fp16=fp16).command()
    assert "--fp16" not in cpu_cmd and cpu_cmd[cpu_cmd.index("--max-tokens") + 1] == "4096"
    monkeypatch.setattr(bleu_decode, "cuda_available", lambda: True)
    cuda, fp16, note = evaluate_bleu.decode_device(args.cpu, args.fp16)
    assert (cuda, fp16, note) == (True, True, None)
    gpu_cmd = evaluate_bleu.decode_config(args, [], cuda=cuda, fp16=fp16).command()
    assert "--fp16" in gpu_cmd
    assert gpu_cmd[gpu_cmd.index("--max-tokens") + 1] == str(evaluate_bleu.GPU_MAX_TOKENS)
    assert gpu_cmd[gpu_cmd.index("--batch-size") + 1] == str(evaluate_bleu.GPU_BATCH_SIZE)
    docs = (REPO / "lab" / "study.md").read_text(encoding="utf-8").replace("\n", " ")
    assert (f"batches of up to {evaluate_bleu.GPU_MAX_TOKENS:,} tokens and {evaluate_bleu.GPU_BATCH_SIZE:,} "
            "sentences on a GPU") in docs
    on_cpu = evaluate_bleu.build_parser().parse_args(["data", "--path", "ck.pt", "--fp16", "--cpu"])
    assert evaluate_bleu.decode_device(on_cpu.cpu, on_cpu.fp16)[1] is False  # --cpu wins even where CUDA exists


FAST_GEN = ["--", "--max-len-a", "0", "--max-len-b", "3"]


def test_untrained_model_logs_its_rate_and_fp16_stays_fp32_on_the_cpu(tiny_data, untrained, tmp_path, capsys):
    out, progress = tmp_path / "bleu.json", tmp_path / "progress.json"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(untrained), "--cpu", "--fp16", "--batch-size", "8",
                             "--beam", "2", "--user-dir", "gradinit", "--rate-chunk", "8", "--output-json", str(out),
                             "--progress-json", str(progress), "--time-limit", "300", *FAST_GEN])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    assert "note: --fp16 ignored" in err and "evaluate_bleu: decode rate" in err
    result = json.loads(out.read_text())
    assert result["precision"] == "fp32" and "fp32" in result["precision_note"]
    assert "--fp16" not in result["generate_command"]
    decode = result["decode"]
    assert decode["sentences_done"] == decode["sentences_total"] == 40 and decode["sentences_per_s"] > 0
    assert decode["source_tokens_per_s"] > 0 and decode["time_limit_s"] == 300.0
    assert decode["first_chunk"]["sentences_done"] >= 8 and decode["first_chunk"]["projected_total_s"] > 0
    assert json.loads(progress.read_text())["sentences_done"] == 40
    # the batch settings fairseq-generate ran with: as asked, fairseq's default token limit, no loader process
    assert result["batches"] == {"max_tokens": None, "batch_size": 8, "num_workers": 0,
                                 "required_batch_size_multiple": 1, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    cmd = result["generate_command"]
    assert cmd[cmd.index("--batch-size") + 1] == "8" and cmd[cmd.index("--num-workers") + 1] == "0"


def test_time_limit_stops_generate_and_keeps_the_rate(tiny_data, untrained, tmp_path, capsys):
    out = tmp_path / "bleu.json"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(untrained), "--cpu", "--batch-size", "8", "--beam", "2",
                             "--user-dir", "gradinit", "--output-json", str(out), "--time-limit", "0.5", *FAST_GEN])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip().splitlines()[-1].startswith("error: fairseq-generate stopped after "), err[-2000:]
    result = json.loads(out.read_text())
    assert result["bleu"] is None and "--time-limit 0.5" in result["reason"]
    assert result["decode"]["time_limit_s"] == 0.5 and result["decode"]["sentences_done"] < 40


def test_a_time_limit_reached_while_the_model_loads_stops_before_the_decode(tiny_data, untrained, tmp_path, capsys,
                                                                             monkeypatch):
    """The timer is armed only once the model and split are loaded: loading is never cut short (an exception inside
    omegaconf's loading left it broken and the run ended with its unrelated error); a limit already spent by then
    stops the run before its first sentence, with the same one line."""
    from fairseq_gradinit.tools import inprocess_generate

    original, loaded = inprocess_generate.SplitDecoder.__init__, []

    def slow_init(self, *args, **kwargs):
        time.sleep(0.8)  # a slow disk: loading outlasts --time-limit 0.5
        original(self, *args, **kwargs)
        loaded.append(True)

    monkeypatch.setattr(inprocess_generate.SplitDecoder, "__init__", slow_init)
    out = tmp_path / "bleu.json"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(untrained), "--cpu", "--batch-size", "8", "--beam", "2",
                             "--user-dir", "gradinit", "--output-json", str(out), "--time-limit", "0.5", *FAST_GEN])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 1 and loaded == [True]
    assert last.startswith("error: fairseq-generate stopped after 0 of ") and "--time-limit 0.5 s reached" in last
    result = json.loads(out.read_text())
    assert result["bleu"] is None and result["decode"]["sentences_done"] == 0


def batches_of_hypotheses(batches, pause_s):
    """fairseq-generate's stdout as it comes: each batch's S/H lines at once, then a pause (the next batch)."""
    sid = 0
    for n in batches:
        time.sleep(pause_s)
        for _ in range(n):
            yield f"S-{sid}\tsource\n"
            yield f"H-{sid}\t-1.0\thypothesis\n"
            sid += 1


def test_rate_is_taken_over_whole_batches():
    """fairseq prints a batch's hypotheses together once the batch is decoded: the first rate counts the
    whole first batch, not the --rate-chunk sentences read first, and a stop comes only on such a rate."""
    from subprocess_bleu import read_output  # the former BLEU step's reader of fairseq-generate's stdout

    meter = evaluate_bleu.DecodeMeter(60, [10] * 60, chunk=5)
    stops = []
    lines = read_output(batches_of_hypotheses([20, 30, 10], 0.4), meter, stops.append, time_limit=None,
                        progress_json=None, report_every_s=0.0, quiet_s=0.2)
    assert len(lines) == 120 and meter.done == 60 and not stops
    first = meter.first_report
    assert first["sentences_done"] == 20  # the first batch, all of it
    assert 0.25 < first["decode_s"] < 1.5
    # a time limit that the whole-batch rate keeps is not broken by a chunk of the first batch
    meter = evaluate_bleu.DecodeMeter(60, [10] * 60, chunk=5)
    read_output(batches_of_hypotheses([20, 30, 10], 0.4), meter, stops.append, time_limit=30.0,
                progress_json=None, report_every_s=0.0, quiet_s=0.2)
    assert not stops and meter.first_report["sentences_done"] == 20
    meter = evaluate_bleu.DecodeMeter(60, [10] * 60, chunk=5)
    read_output(batches_of_hypotheses([20, 30, 10], 0.4), meter, stops.append, time_limit=0.5,
                progress_json=None, report_every_s=0.0, quiet_s=0.2)
    assert stops and "beyond --time-limit 0.5 s" in stops[0]


def test_host_generate_builds_the_same_strings_from_lists():
    import torch
    from fairseq.data import Dictionary

    from fairseq_gradinit.tools import host_generate

    d = Dictionary()
    for w in ("\u2581Hallo", "\u2581Welt", "en", "\u2581!"):
        d.add_symbol(w)
    rows = torch.tensor([[4, 5, 6, 3, 2], [7, 4, 1, 1, 2]])
    original = Dictionary.string
    wrapped = host_generate.string_from_host_list(original)
    for kwargs in ({}, {"bpe_symbol": "sentencepiece"}, {"escape_unk": True, "extra_symbols_to_ignore": [1]},
                   {"bpe_symbol": "sentencepiece", "include_eos": True}):
        assert wrapped(d, rows[0], **kwargs) == original(d, rows[0], **kwargs)
        assert wrapped(d, rows, **kwargs) == original(d, rows, **kwargs)
    seen = []

    class Spy(torch.Tensor):  # counts element reads: the list is made once, no element is read as a tensor
        def __iter__(self):
            seen.append("iter")
            return super().__iter__()

    assert wrapped(d, rows[0].as_subclass(Spy)) == original(d, rows[0]) and not seen
    original(d, rows[0].as_subclass(Spy))
    assert seen == ["iter"]


def test_decode_benchmark_times_alone_and_at_once(tiny_data, untrained, tmp_path):
    """benchmarks/bench_bleu_decode.py on the CPU: a case with fairseq's own generate module and given batches
    alone, then two decodes at once; each decode's result, batch settings and rate are in its JSON."""
    import bench_bleu_decode  # benchmarks/ is on pytest's pythonpath

    out = tmp_path / "bench.json"
    rc = bench_bleu_decode.main([str(tiny_data), "--path", str(untrained), "--user-dir", "gradinit", "--cpu",
                                 "--beam", "2", "--case", "stock:1:400:8:stock", "--case", "two:2", "--out", str(out),
                                 *FAST_GEN])
    report = json.loads(out.read_text())
    assert rc == 0, report
    stock, two = report["cases"]
    assert (stock["name"], stock["at_once"], len(stock["decodes"])) == ("stock", 1, 1)
    assert (two["at_once"], len(two["decodes"])) == (2, 2)
    assert stock["decodes"][0]["batches"]["max_tokens"] == 400 and stock["decodes"][0]["batches"]["batch_size"] == 8
    assert two["decodes"][0]["batches"]["max_tokens"] == evaluate_bleu.CPU_MAX_TOKENS
    for case in (stock, two):
        assert case["wall_s"] > 0 and case["sentences_per_s"] > 0
        for d in case["decodes"]:
            assert d["returncode"] == 0 and d["n_sentences"] == 40 and d["decode"]["sentences_done"] == 40
            assert 0 < d["wall_s"] <= case["wall_s"] and d["cpu_s"] > 0
    def module(log):
        running = next(line for line in (tmp_path / "bench" / log).read_text().splitlines()
                       if line.startswith("evaluate_bleu: running fairseq-generate (python -m "))
        return running.split()[5].rstrip(";")

    assert module("stock.0.log") == "fairseq_cli.generate"
    assert module("two.1.log") == "fairseq_gradinit.tools.host_generate"
    with pytest.raises(SystemExit):
        bench_bleu_decode.main([str(tiny_data), "--path", "x.pt", "--case", "bad:0", "--out", str(out)])
