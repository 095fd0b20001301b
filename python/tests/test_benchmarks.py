"""The PyTorch benchmarks (python/bench/) run end to end on the CPU, as the GPU machine runs them:
bench_torch.py on the founding case and bench_mla.py on V2-Lite at T=1 (transformers' code
eager and under torch.compile, and latentkv), each writing its JSON. A benchmark that broke (an
API it uses gone, a field renamed) fails here rather than on the GPU machine, where device time is
scarce. Their timings on the CPU are not checked; their correctness checks are, and so is
bench_mla.py's verdict on made-up rows. Skipped without torch or transformers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script, args, tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(BENCH / script), "--device", "cpu", *args,
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_bench_torch_runs_on_the_cpu(tmp_path):
    result = run_bench("bench_torch.py", ["--cases", "founding", "--dtypes", "fp32", "--iters",
                                          "20", "--repeats", "2"], tmp_path)
    (row,) = result["rows"]
    assert row["case"] == "founding"
    # float32 on the CPU backend against the float64 reference: ~1e-7 (FMA order only).
    assert row["rel_error_latentkv"] < 1e-5
    assert row["wall_latentkv_us"] > 0


def test_bench_mla_runs_on_the_cpu(tmp_path):
    result = run_bench("bench_mla.py", ["--rows", "v2-lite:1", "--rotate", "1"], tmp_path)
    (row,) = result["rows"]
    assert (row["case"], row["tokens"], row["sets"]) == ("v2-lite", 1, 1)
    assert row["compile_error"] is None
    # latentkv's CPU backend (float32) against transformers' eager float32 code: rounding only.
    assert row["check"] < 1e-5
    for variant in ("hf eager", "hf compile", "latentkv"):
        assert row[variant]["wall_us"] > 0
        assert row[variant]["gpu_us"] is None  # no GPU fields on the CPU


def test_bench_mla_verdict_names_what_failed():
    sys.path.insert(0, str(BENCH))
    from bench_mla import verdict

    def row(ours, compiled, target, error=None):
        return {"compile_error": error, "latentkv": {"gpu_us": ours},
                "hf compile": {"gpu_us": compiled}, "target_us": target}

    assert verdict(row(5.0, 10.0, 6)) == "pass"
    assert verdict(row(5.0, 10.0, None)) == "pass"
    assert verdict(row(7.0, 10.0, 6)) == "over target"
    assert verdict(row(10.0, 10.0, 20)) == "FAIL: slower than compile"
    assert verdict(row(11.0, 10.0, 6)) == "FAIL: slower than compile"
    assert verdict(row(5.0, 10.0, 6, error="recompiled")) == "FAIL (recompiles)"
    assert verdict(row(None, None, 6)) == "-"  # the CPU run: no GPU times
