"""The benchmark harness: rows consistent with their own numbers, the table written from them."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from normlab.lab import bench


def test_bench_rows_are_consistent():
    rows = bench.bench_one("add_rms_norm", (64, 32), "float32", copy_speed=10.0, repeats=3, warmup=1)
    assert [r.mode for r in rows] == ["fwd", "fwd+bwd"]
    for r in rows:
        # the row holds ms rounded to 1 us and the ratio to 0.01: allow for both roundings
        assert r.ratio == pytest.approx(r.torch_ms / r.normlab_ms, rel=0.05, abs=0.006)
        assert r.gbps > 0 and r.floor_pct > 0
    assert rows[1].saved_mb_normlab is not None
    text = bench.markdown({"machine": bench.machine(), "copy_gbps": 10.0, "rows": [vars(r) for r in rows]})
    assert text.count("| add_rms_norm |") == 2
    # which instruction sets ran: torch's (ATEN_CPU_CAPABILITY lowers it) and normlab's build
    assert f"torch's CPU kernels for {torch.backends.cpu.get_cpu_capability()}" in text
    assert "-march=native" in text


def test_bench_records_the_kernels_build_flags(monkeypatch):
    monkeypatch.setenv("NORMLAB_CXXFLAGS", "-march=haswell")
    assert bench.machine()["kernel_flags"].endswith("-march=haswell")


def test_gpu_section_is_skipped_with_a_message_without_cuda(monkeypatch, tmp_path, capsys):
    from normlab.cli import main
    from normlab.lab import bench_gpu

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert bench_gpu.run() == {"skipped": "no CUDA device: GPU section skipped"}
    assert bench_gpu.markdown(bench_gpu.run()) == "GPU: no CUDA device: GPU section skipped."
    assert main(["bench", "--ops", "rms_norm", "--shapes", "64x32", "--dtypes", "float32", "--repeats", "1",
                 "--threads", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| rms_norm | 64x32 |" in out and "GPU: no CUDA device: GPU section skipped." in out
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["gpu"] == {"skipped": "no CUDA device: GPU section skipped"}
    assert saved["provenance"]["normlab"] and saved["provenance"]["threads"] == 1
    # how each median was taken, in the file (only the argv said it, and only where --repeats was typed)
    assert saved["repeats"] == 1 and saved["warmup"] == 3
    assert "Medians of 1 timed repeats per case after 3 warm-ups." in (tmp_path / "bench.md").read_text()
    assert main(["bench", "--device", "cuda", "--out", str(tmp_path / "new")]) == 2  # no GPU: one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda: no CUDA GPU is available" in err
    assert not (tmp_path / "new").exists()  # the folder was made before the device was found missing


def test_bench_writes_a_figure_and_what_changed_its_timings(monkeypatch, tmp_path, capsys):
    """bench wrote a table and JSON but no figure; a value given twice was timed twice; the JSON said nothing of
    the environment that moves the timings, and named the kernels' flags where no kernel had been built."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from normlab.cli import main
    from normlab.kernels import cpu

    monkeypatch.setenv("NORMLAB_STREAM_BYTES", "0")
    # glibc's allocator settings moved a case from 34-40% to 98% of the floor, and were not recorded (read at a
    # process's start: harmless here)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=4294967296")
    cpu._stream_override.cache_clear()
    try:
        assert main(["bench", "--ops", "rms_norm", "rms_norm", "--shapes", "64x32", "64x32", "--dtypes", "float32",
                     "float32", "--repeats", "1", "--threads", "1", "--out", str(tmp_path)]) == 0
    finally:
        cpu._stream_override.cache_clear()
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["op"], r["shape"], r["mode"]) for r in saved["rows"]] == [("rms_norm", "64x32", "fwd"),
                                                                         ("rms_norm", "64x32", "fwd+bwd")]
    assert saved["environment"]["NORMLAB_STREAM_BYTES"] == "0" and saved["kernels"]["available"] == cpu.available()
    assert saved["environment"]["MALLOC_ARENA_MAX"] == "2" and "GLIBC_TUNABLES" in saved["environment"]
    md = (tmp_path / "bench.md").read_text()
    assert "Environment: " in md and "NORMLAB_STREAM_BYTES=0" in md and "Made by normlab " in md
    assert Image.open(tmp_path / "bench.png").text["Software"].startswith("normlab ")
    monkeypatch.setattr(cpu, "available", lambda: False)  # no kernels built here: said, not their flags
    assert bench.machine()["kernel_flags"] is None and "C++ kernels unavailable" in bench.kernels_note(
        bench.machine())


def test_a_figure_that_cannot_be_written_is_named_and_leaves_nothing(monkeypatch, tmp_path):
    """On a full disk the JSON and table were left without their figure, and the error named no file."""
    import errno

    from normlab.lab import bench_figure, bench_files

    def full(kind, result, path):
        pathlib.Path(path).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")  # as matplotlib's writer says it: no file named

    monkeypatch.setattr(bench_figure, "draw", full)
    with pytest.raises(OSError) as e:
        bench_files.write(tmp_path, "norms", {"rows": []}, "table")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "bench.png")
    assert list(tmp_path.iterdir()) == []


def test_half_precision_rows_count_their_own_bytes():
    """The floor and GB/s of a float16 case use 2 bytes per element (4 would double both)."""
    (fwd, both) = bench.bench_one("rms_norm", (64, 32), "float16", copy_speed=10.0, repeats=3, warmup=1)
    for row, tensors in ((fwd, 2), (both, 5)):
        nbytes = tensors * 64 * 32 * 2
        assert row.gbps == pytest.approx(nbytes / row.normlab_ms / 1e6, rel=0.01)
        assert row.floor_pct == pytest.approx(100 * nbytes / 10e9 * 1e3 / row.normlab_ms, rel=0.01)
        assert row.faults_normlab >= 0 and row.faults_torch >= 0
    assert "float16" in bench.DTYPES


def test_page_faults_counts_fresh_pages():
    """64 MB of fresh anonymous memory touched once: one fault per page (4 KB; 2 MB where transparent huge pages
    are always on), whatever the allocator's state (an allocation's pages may come from memory it kept)."""
    import mmap

    def touch():
        m = mmap.mmap(-1, 64 << 20)
        for i in range(0, len(m), 4096):
            m[i] = 1
        m.close()

    assert bench.page_faults(touch) >= (64 << 20) // (2 << 20)
    x = torch.ones(1 << 10)
    assert bench.page_faults(lambda: x.add_(1)) < 1000


def test_dispatch_table_says_what_auto_runs_and_why(tmp_path, monkeypatch, capsys):
    from normlab.cli import main
    from normlab.kernels import autotune, cpu
    from normlab.lab import bench_dispatch

    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner(tmp_path / "dispatch.json"))
    monkeypatch.setattr(autotune, "_enabled", True)
    decided, seen = [], []
    real = bench_dispatch.kernels.decide
    monkeypatch.setattr(bench_dispatch.kernels, "decide", lambda *a: decided.append(1) or real(*a))
    result = bench_dispatch.run(("layer_norm", "rms_norm"), ((4, 768), (64, 768)), ("float32",),
                                progress=lambda i, n, note: seen.append((i, len(decided))))
    assert seen == [(i, i + 1) for i in range(8)]  # each decision reported once made, counted from 0
    rows = {(r["op"], r["shape"], r["mode"]): r for r in result["rows"]}
    ln, ln64, rms = rows["layer_norm", "4x768", "train"], rows["layer_norm", "64x768", "train"], \
        rows["rms_norm", "4x768", "train"]
    fwd = rows["layer_norm", "4x768", "fwd"]
    if cpu.available():
        assert ln["why"] == fwd["why"] == "measured" and set(ln["ms"]) == {"cpu", "native"} and ln["impl"] in ln["ms"]
        assert ln64["key"] == ln["key"] and ln64["impl"] == ln["impl"]  # one decision per key
        assert fwd["key"] == ln["key"].replace("|train", "|fwd")  # inference: a decision of its own
    assert rms["why"] == "only candidate" and rms["ms"] == {}
    text = bench_dispatch.markdown(result)
    assert f"| layer_norm | 4x768 | float32 | train | {ln['impl']} | {ln['why']} |" in text
    assert main(["bench", "--dispatch", "--ops", "rms_norm", "--shapes", "8x16", "--dtypes", "bfloat16",
                 "--threads", "1", "--out", str(tmp_path)]) == 0
    assert "| rms_norm | 8x16 | bfloat16 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "bench-dispatch.json").read_text())["rows"][0]["op"] == "rms_norm"
    assert main(["bench", "--profile", "--out", str(tmp_path)]) == 2
    assert "--profile needs --model" in capsys.readouterr().err


def test_every_timed_call_follows_the_cache_flush():
    """With a flush, normlab and torch each start from the same cold cache: the flush runs right before every
    call (warm-ups included), both orders occur, and its own time comes back last."""
    from normlab.lab.bench import _interleaved_ms

    log = []
    out = _interleaved_ms([lambda: log.append("a"), lambda: log.append("b")], repeats=4, warmup=1,
                          flush=lambda: log.append("f"))
    assert len(out) == 3 and all(t >= 0 for t in out)
    assert log[0::2] == ["f"] * (len(log) // 2) and len(log) == 2 * (2 + 2 * 4)
    calls = "".join(log[1::2])
    assert calls.count("a") == calls.count("b") == 5 and "ab" in calls[2:] and "ba" in calls[2:]


def test_the_bench_reports_each_case_when_it_is_done(monkeypatch):
    """Progress callbacks count from 0 the item just finished: the bench called them before each case, so a
    bar read 1 of 2 before anything was timed and closed while the last case still ran."""
    done = []
    real = bench.bench_one
    monkeypatch.setattr(bench, "bench_one", lambda *a, **k: done.append(1) or real(*a, **k))
    monkeypatch.setattr(bench, "torch_vs_itself", lambda **k: 1.0)
    seen = []
    bench.run(("rms_norm",), ((64, 32), (32, 32)), ("float32",), repeats=1,
              progress=lambda i, n, note: seen.append((i, n, len(done))))
    assert seen == [(0, 2, 1), (1, 2, 2)]


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_the_bytes_counted_are_the_tensors_a_step_reads_and_writes(op):
    """The add ops' forward+backward counted 8 tensors (one gradient for both inputs), but each input's .grad is
    a tensor of its own: 9, and their GB/s and floor shares read 8/9 of the truth."""
    from normlab.lab.bench import TENSORS_MOVED, _calls

    n, d = 64, 32
    add = op.startswith("add")
    x, r = torch.randn(n, d, requires_grad=True), torch.randn(n, d, requires_grad=True)
    w, b = torch.ones(d, requires_grad=True), torch.zeros(d, requires_grad=True)
    out = _calls(op, x, r if add else None, w, None if "rms" in op else b)[0]()
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
    written = {t.untyped_storage().data_ptr() for t in (*outs, x.grad, *((r.grad,) if add else ()))}
    inputs = 1 + add  # x (and r) read by the forward
    grads_in = len(outs) + 1  # dy (and ds), and what the backward rereads (x, or s)
    assert TENSORS_MOVED[op] == (inputs + len(outs), inputs + len(written) + grads_in)


def test_a_run_that_draws_no_figure_leaves_no_earlier_figure_beside_its_numbers(monkeypatch, tmp_path):
    """Without matplotlib (or a --dispatch table with nothing measured) the earlier run's bench.png stayed beside
    the new JSON and table, drawing other numbers."""
    from normlab.lab import bench_figure, bench_files

    monkeypatch.setattr(bench_figure, "draw", lambda kind, result, path: pathlib.Path(path).write_bytes(b"\x89PNG")
                        or True)
    assert (tmp_path / "bench.png") in bench_files.write(tmp_path, "norms", {"rows": []}, "table")
    monkeypatch.setattr(bench_figure, "draw", lambda kind, result, path: False)
    assert bench_files.write(tmp_path, "norms", {"rows": [], "run": 2}, "table") == [tmp_path / "bench.json",
                                                                                    tmp_path / "bench.md"]
    assert not (tmp_path / "bench.png").exists()


def test_a_cold_start_that_fails_says_why_in_one_line(monkeypatch):
    """The fresh process's failure was a CalledProcessError traceback, "a bug in normlab", its own error hidden."""
    import subprocess

    from normlab._checks import UserError

    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: real(
        [cmd[0], "-c", "import sys; sys.exit('no room for the build cache')"], **kw))
    with pytest.raises(UserError, match=r"^the cold start's fresh process failed \(exit 1: no room for the build "
                                        r"cache\); run without --cold-start$"):
        bench.cold_start_seconds()


def test_the_dispatch_table_with_autotune_off_claims_no_cache():
    from normlab.lab import bench_dispatch

    result = {"machine": {"cpu": "x", "threads": 1}, "autotune": False, "cache": "/c/dispatch.json", "unsaved": None,
              "rows": []}
    head = bench_dispatch.markdown(result).splitlines()[0]
    assert "the fixed table decides; no decision is read or saved" in head and "cached in" not in head


def test_the_speed_bars_run_from_the_1x_line():
    """On the log axis each bar started at the axis' left edge: 0.75x and 0.78x drew about 1:3 in length."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from normlab.lab.bench_figure import _norms

    rows = [{"op": "layer_norm", "shape": "8x8", "dtype": "float32", "mode": m, "ratio": r, "floor_pct": 50.0}
            for m, r in (("forward", 0.75), ("forward", 0.78), ("forward+backward", 2.0))]
    fig = _norms(plt, {"rows": rows, "copy_gbps": 10.0})
    try:
        speed = fig.axes[0]
        spans = [sorted((p.get_x(), p.get_x() + p.get_width())) for p in speed.patches]
        assert spans == [pytest.approx([0.75, 1.0]), pytest.approx([0.78, 1.0]), pytest.approx([1.0, 2.0])], spans
    finally:
        plt.close(fig)
