"""``auto`` measures once per key, keeps the decision, saves it per machine, and never trusts a bad cache."""
from __future__ import annotations

import importlib
import json
import warnings

import pytest
import test_numerics
import torch

from normlab import kernels
from normlab.kernels import autotune, build, cpu

needs_two = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: nothing to choose between")


@pytest.fixture
def tuner(tmp_path, monkeypatch):
    """A fresh tuner with its own file, and autotune on whatever the environment says."""
    t = autotune.Tuner(tmp_path / "dispatch.json")
    monkeypatch.setattr(autotune, "TUNER", t)
    monkeypatch.setattr(autotune, "_enabled", True)  # restored after the test, as is everything set here
    return t


def _rigged(monkeypatch, winner: str):
    """Make timing report ``winner`` 10x faster than every other candidate; count the timings."""
    calls = []

    def fake(cands, op, x, d, eps, backward=True):
        calls.append(op if backward else f"{op} fwd")
        return {n: (0.1 if n == winner else 1.0) for n in cands}, f"4x{d}"

    monkeypatch.setattr(autotune, "_time", fake)
    return calls


@needs_two
def test_rows_with_a_tail_are_decided_apart():
    """Rows of 75 and 80 share a length bucket but not a kernel's speed (75 has a tail the C++ kernels sum and store
    one by one): each gets its own decision. A row alone and in a batch still share one."""
    half = lambda n, d: torch.zeros(n, d, dtype=torch.bfloat16)  # noqa: E731
    assert autotune.key("layer_norm", half(4, 75), 75) != autotune.key("layer_norm", half(4, 80), 80)
    assert autotune.key("layer_norm", half(1, 75), 75) == autotune.key("layer_norm", half(900, 75), 75)
    assert autotune.row_class(80, torch.bfloat16) == "d128" and autotune.row_class(75, torch.bfloat16) == "d128t"
    assert autotune.row_class(8, torch.float64) == "d8" and autotune.row_class(8, torch.float32) == "d8t"


def test_decision_is_measured_once_kept_and_saved(tuner):
    x = torch.randn(8, 256)
    d = kernels.decide("auto", "layer_norm", x, 1e-5)
    assert d.why == "measured" and set(d.ms) == {"cpu", "native"} and d.impl in d.ms
    assert d.cost_ms < 1000  # a few ms on a quiet machine; generous for a shared one
    assert kernels.decide("auto", "layer_norm", torch.randn(5000, 256), 1e-5) is d  # another batch: same key
    (saved,) = json.loads(tuner.path.read_text())["configs"]
    assert saved["machine"] == autotune.machine()
    assert tuner.path.stat().st_mode & 0o777 == 0o644  # others sharing the cache read it, as the kernels beside it
    (k,) = saved["decisions"]
    assert k == f"layer_norm|float32|d256|t{torch.get_num_threads()}|cpu|train"
    assert saved["decisions"][k]["impl"] == d.impl
    again = autotune.Tuner(tuner.path).choose("layer_norm", x, 256, 1e-5, {"cpu": None, "native": None}, "cpu")
    assert again.why == "cached" and again.impl == d.impl


def test_sample_is_out_of_cache_whatever_the_first_call(monkeypatch):
    """On CPU the sample is an output of SAMPLE_MAX_BYTES or twice the cores' own caches, at least the streaming
    threshold, whatever the size of the call that asks: a small first call does not decide in cache for the
    machine's large calls. Elsewhere SAMPLE_ELEMS."""
    monkeypatch.setattr(cpu, "private_cache_bytes", lambda: 256 << 10)
    private = torch.get_num_threads() * (256 << 10)
    monkeypatch.setattr(cpu, "stream_bytes", lambda: private)  # the default rule: the cores' own caches
    want = max(autotune.SAMPLE_MAX_BYTES, 2 * private) // 1024
    for rows in (1, 100, private // 1024, 40000):  # 1 KB, in cache, at the threshold, 40 MB
        assert autotune.sample_rows(torch.empty(rows, 256), 256) == want
    assert autotune.sample_rows(torch.empty(3, 256, dtype=torch.bfloat16), 256) == 2 * want  # bytes, not rows
    assert autotune.sample_rows(torch.empty(3, 100), 100) == -(-(want * 1024) // 400)  # rounded up
    monkeypatch.setattr(cpu, "private_cache_bytes", lambda: 64 << 20)  # large own caches: twice them
    assert autotune.sample_rows(torch.empty(8, 256), 256) == torch.get_num_threads() * (128 << 20) // 1024
    monkeypatch.setattr(cpu, "private_cache_bytes", lambda: 1 << 10)
    monkeypatch.setattr(cpu, "stream_bytes", lambda: 64 << 20)  # a larger threshold (NORMLAB_STREAM_BYTES)
    assert autotune.sample_rows(torch.empty(8, 256), 256) == (64 << 20) // 1024  # streamed, as the calls are
    small = autotune.SAMPLE_ELEMS // 256
    assert autotune.sample_rows(torch.empty(4096, 256, device="meta"), 256) == small  # not a CPU call


def test_rows_shorter_than_a_cache_line_are_timed_on_a_bounded_sample(monkeypatch):
    """A row of 1 element was timed on the 8 MB's 2M rows: 0.55 s a decision (the cost is per row)."""
    assert autotune.sample_rows(torch.empty(4, 1), 1) == autotune.SAMPLE_MAX_ROWS
    monkeypatch.setattr(autotune, "SAMPLE_MAX_ROWS", 1000)
    assert autotune.sample_rows(torch.empty(4, 3, dtype=torch.bfloat16), 3) == 1000
    assert autotune.sample_rows(torch.empty(4, 16), 16) > 1000  # a whole cache line: sized in bytes


def test_private_cache_is_the_largest_below_the_last_level(monkeypatch):
    size = cpu.private_cache_bytes()
    assert 16 << 10 <= size <= cpu.last_level_cache_bytes()
    for caches, want in ((((1, 48 << 10), (2, 2 << 20), (3, 260 << 20), (1, 32 << 10)), 2 << 20),
                         (((1, 32 << 10), (2, 512 << 10), (3, 8 << 20)), 512 << 10),
                         (((1, 64 << 10),), 1 << 20), ((), 1 << 20)):  # one level, or none readable: 1 MiB
        monkeypatch.setattr(cpu, "_caches", lambda c=caches: c)
        cpu.private_cache_bytes.cache_clear()
        try:
            assert cpu.private_cache_bytes() == want, caches
        finally:
            cpu.private_cache_bytes.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_tensors_are_varied_finite_values_of_the_calls_kind(dtype):
    """The sample repeats a block of SAMPLE_BLOCK seeded draws (drawing every value cost most of a large
    decision): each tensor still has the call's dtype and shape, values in [-2, 2], rows that differ from
    one another and are not constant, and x, dy, r, ds are different tensors."""
    spec, x, r, w, b, dy, ds = autotune._sample("add_layer_norm", dtype, 768, "cpu", 40)
    for t in (x, r, dy, ds):
        assert t.shape == (40, 768) and t.dtype == dtype and t.is_contiguous()
        assert torch.isfinite(t).all() and t.abs().max() <= 2 and (t.float().std(1) > 0.5).all()
        assert not torch.equal(t[0], t[1])
    assert w.shape == b.shape == (768,)
    assert len({t.float().sum().item() for t in (x, r, dy, ds)}) == 4


@needs_two
def test_a_decision_never_changes_mid_run(tuner, monkeypatch):
    calls = _rigged(monkeypatch, "native")
    x = torch.randn(8, 300)
    assert kernels.resolve("auto", "add_layer_norm", x, 1e-5) == "native"
    _rigged(monkeypatch, "cpu")  # the machine "changes its mind": the process does not
    assert kernels.resolve("auto", "add_layer_norm", x, 1e-5) == "native" and calls == ["add_layer_norm"]


@needs_two
def test_inference_is_its_own_decision_timed_forward_only(tuner, monkeypatch):
    """Under no_grad no backward follows: the key says ``fwd`` and only the forward is timed, so inference may
    run torch's forward where training runs the C++ pair; each mode keeps its own decision for the process."""
    timed = []

    def fake(cands, op, x, d, eps, backward=True):
        timed.append(backward)
        return ({"cpu": 0.1, "native": 1.0} if backward else {"cpu": 1.0, "native": 0.1}), f"4x{d}"

    monkeypatch.setattr(autotune, "_time", fake)
    x = torch.randn(8, 768)
    assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "cpu"
    with torch.no_grad():
        assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "native"
        assert autotune.key("layer_norm", x, 768).endswith("|fwd")
    with torch.inference_mode():
        assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "native"
    assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "cpu" and timed == [True, False]
    (saved,) = json.loads(tuner.path.read_text())["configs"]
    assert {k.rsplit("|", 1)[1] for k in saved["decisions"]} == {"train", "fwd"}


@needs_two
@pytest.mark.parametrize("cpu_ms,chosen", [(0.97, "native"), (0.94, "cpu"), (1.03, "native")])
def test_a_tie_goes_to_torch(tuner, monkeypatch, cpu_ms, chosen):
    """The fixed table says cpu at D = 768, but within the margin torch's kernel is kept (3% is noise, and
    ``auto`` must never be slower than torch); 6% faster is not noise."""
    monkeypatch.setattr(autotune, "_time", lambda c, *a, **k: ({"cpu": cpu_ms, "native": 1.0}, "4x768"))
    assert kernels.resolve("auto", "layer_norm", torch.randn(4, 768), 1e-5) == chosen


@pytest.mark.parametrize("content", ["{not json", '{"format": 1, "machine": {}, "decisions": {}}', "[]",
                                     '{"format": "99"}', '{"format": 2, "configs": [{"machine": {}}]}',
                                     '{"format": 2, "configs": [{"machine": [], "decisions": {}}]}',
                                     b"\xff\xfe{}", "[" * 100_000])  # not UTF-8; nested past Python's recursion limit
@needs_two
def test_corrupt_cache_is_ignored_with_one_warning(content, tuner, monkeypatch):
    """The last two raised at every call (UnicodeDecodeError, RecursionError), in every process, until deleted."""
    (tuner.path.write_bytes if isinstance(content, bytes) else tuner.path.write_text)(content)
    calls = _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="ignoring .*dispatch.json") as rec:
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
        assert kernels.resolve("auto", "add_layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert len([w for w in rec if "ignoring" in str(w.message)]) == 1 and calls == ["layer_norm", "add_layer_norm"]
    assert json.loads(tuner.path.read_text())["format"] == autotune.FORMAT  # rewritten whole


@needs_two
def test_a_file_the_environment_names_that_is_not_a_dispatch_cache_is_left_as_it_is(tmp_path, monkeypatch):
    """NORMLAB_DISPATCH_FILE naming the user's own JSON: it was replaced by the decisions; a path under a folder
    that does not exist made the folders."""
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": 1, "notes": "my settings"}')
    monkeypatch.setenv(autotune.FILE_ENV, str(mine))
    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner())
    monkeypatch.setattr(autotune, "_enabled", True)
    _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="mine.json: it is not a valid dispatch cache .* left as it is"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert mine.read_text() == '{"mine": 1, "notes": "my settings"}'
    assert autotune.TUNER.unsaved.startswith(f"{mine} is not a valid dispatch cache")
    monkeypatch.setenv(autotune.FILE_ENV, str(tmp_path / "no" / "such" / "d.json"))
    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner())
    assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert not (tmp_path / "no").exists() and "No such file or directory" in autotune.TUNER.unsaved


@needs_two
def test_a_forward_autograd_does_not_record_is_decided_by_the_forwards_timing(tuner, monkeypatch):
    """In grad mode with nothing requiring grad (a frozen encoder's forward) only the forward runs, but the
    kernel was the one the forward and backward pair's timing chose."""
    from normlab import functional as F

    calls = _rigged(monkeypatch, "cpu")
    x, w = torch.randn(4, 64), torch.ones(64)
    y = F.layer_norm(x, 64, w)  # grad mode on, nothing to record
    assert not y.requires_grad and calls == ["layer_norm fwd"]
    F.layer_norm(x, 64, w.requires_grad_())  # recorded: the pair's decision, taken now
    with torch.no_grad():
        F.layer_norm(x, 64, w)  # the forward's, as decided above
    assert calls == ["layer_norm fwd", "layer_norm"]
    assert sorted(k.rsplit("|", 1)[1] for k in tuner.decisions()) == ["fwd", "train"]


@needs_two
def test_a_newer_normlabs_cache_is_read_past_and_left_as_it_is(tuner, monkeypatch):
    """Two normlab versions sharing the cache: the older one rewrote the newer one's file in its own format, each
    erasing the other's decisions on every run."""
    newer = json.dumps({"format": autotune.FORMAT + 1, "configs": [{"what": "a newer layout"}]})
    tuner.path.write_text(newer)
    calls = _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="newer normlab's: left as it is"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert calls == ["layer_norm"] and tuner.path.read_text() == newer


@pytest.mark.parametrize("entry", [{"impl": ["native"]}, {"impl": {"a": 1}}, {"impl": "native", "ms": {"cpu": "x"}},
                                   {"impl": "native", "cost_ms": None}, {"impl": "native", "extra": 1}, "native"])
@needs_two
def test_this_machines_section_with_a_bad_decision_is_ignored_with_one_warning(entry, tuner, monkeypatch):
    """A decision whose impl was a list parsed, then raised TypeError (unhashable) at every call in every process
    until the file was deleted."""
    x = torch.randn(4, 64)
    section = {"machine": autotune.machine(), "decisions": {autotune.key("layer_norm", x, 64): entry}}
    tuner.path.write_text(json.dumps({"format": autotune.FORMAT, "configs": [section]}))
    _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="not a valid dispatch cache"):
        assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "cpu"


@needs_two
# another CPU; other kernels; the same kernels compiled otherwise; torch limited to another instruction set
@pytest.mark.parametrize("field", ["isa", "kernels", "build", "torch_isa"])
def test_cache_from_another_machine_is_ignored(tuner, monkeypatch, field):
    x = torch.randn(4, 64)
    k = autotune.key("layer_norm", x, 64)
    other = {**autotune.machine(), field: "0123456789abcdef"}
    entry = {"impl": "native", "why": "measured", "ms": {"cpu": 9.0, "native": 1.0}, "sample": "4x64", "cost_ms": 1}
    section = {"machine": other, "decisions": {k: entry}}
    tuner.path.write_text(json.dumps({"format": autotune.FORMAT, "configs": [section]}))
    _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="another machine"):
        assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "cpu"
    # the other configuration's decisions are kept beside this one's, and neither process warns again
    sections = json.loads(tuner.path.read_text())["configs"]
    assert [s["machine"] for s in sections] == [autotune.machine(), other]
    assert sections[1]["decisions"] == {k: entry}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert autotune.Tuner(tuner.path).decisions()[k].impl == "cpu"


@needs_two
def test_the_file_keeps_a_few_configurations(tuner, monkeypatch):
    """Each configuration that shares the file adds its section at the front; the oldest fall out."""
    entry = {"impl": "native", "why": "measured", "ms": {"cpu": 9.0, "native": 1.0}, "sample": "4x64", "cost_ms": 1}
    others = [{"machine": {**autotune.machine(), "normlab": f"0.0.{i}"}, "decisions": {"k": entry}} for i in range(6)]
    tuner.path.write_text(json.dumps({"format": autotune.FORMAT, "configs": others}))
    _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="another machine"):
        kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5)
    kept = json.loads(tuner.path.read_text())["configs"]
    assert len(kept) == autotune.MAX_CONFIGS and kept[0]["machine"] == autotune.machine()
    assert kept[1:] == others[: autotune.MAX_CONFIGS - 1]


@needs_two
def test_no_timer_or_switched_off_uses_the_fixed_table(tuner, monkeypatch):
    calls = _rigged(monkeypatch, "native")
    x = torch.randn(4, 768)  # the fixed table says cpu here
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        assert kernels.decide("auto", "layer_norm", x, 1e-5).why.startswith("fixed table (no timer")
    with torch.no_grad():
        seen = []
        torch.jit.trace(lambda t: seen.append(kernels.resolve("auto", "layer_norm", t, 1e-5)) or t * 1, (x,),
                        check_trace=False)
    assert seen == ["cpu"]
    monkeypatch.setenv("NORMLAB_AUTOTUNE", "0")
    autotune.set_autotune(None)
    assert kernels.decide("auto", "layer_norm", x, 1e-5).why == "fixed table (autotune off)"
    for value in ("banana", "Off "):  # not a switch: on, said once; a switch in any case and spacing: read
        monkeypatch.setenv("NORMLAB_AUTOTUNE", value)
        autotune.set_autotune(None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert autotune.enabled() == (value == "banana")
        assert [str(w.message) for w in seen] == (
            ["NORMLAB_AUTOTUNE='banana' is not a switch (1, true, yes, on, or 0, false, no, off): taken as on"]
            if value == "banana" else [])
    monkeypatch.setenv("NORMLAB_AUTOTUNE", "1")
    autotune.set_autotune(False)
    assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "cpu" and calls == []
    autotune.set_autotune(True)
    assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "native"


@needs_two
@pytest.mark.parametrize("winner", ["cpu", "native"])
@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm", "rms_norm"])
def test_autotuned_choices_pass_the_numerics_suite(winner, op, tuner, monkeypatch):
    """Whichever candidate the timing crowns, ``auto`` then satisfies the contract's core checks; a kernel
    that cannot run the op (torch's has no RMSNorm) is never a candidate, however fast."""
    _rigged(monkeypatch, winner)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="normlab")  # no stray warning from the tuner either
        test_numerics.test_accuracy_rule(op, torch.float32, 4.0, 10.0, "auto")
        test_numerics.test_batch_invariance(op, torch.float32, "auto")
        test_numerics.test_bitwise_repeatable(op, torch.float64, "auto")
        test_numerics.test_weight_gradients_include_the_last_partial_block(op, torch.float64, 70, "auto")
        test_numerics.test_all_zero_row_gives_bias(op, 0.0, "auto")  # torch's kernel gives NaN there
    xbf = torch.randn(2, 768).bfloat16()
    assert kernels.resolve("auto", op, xbf, 1e-5) == "cpu"  # torch's: bf16 statistics, no backward from them
    with torch.no_grad():  # nor forward-only: its half forward misses the bias on constant rows of large values
        assert kernels.resolve("auto", op, xbf, 1e-5) == "cpu"
        test_numerics.test_forward_only_accuracy_rule(op, torch.bfloat16, 4.0, 10.0, "auto")
        test_numerics.test_forward_only_half_uses_float32_statistics(op, torch.float16, "auto")
    for d, dt in ((768, torch.float32), (256, torch.float32), (384, torch.float64), (40, torch.float64)):
        assert kernels.resolve("auto", op, torch.randn(2, d, dtype=dt), 1e-5) == (winner if "layer" in op else "cpu")


@needs_two
def test_dispatch_remembers_each_route_and_keeps_them_apart(tuner, monkeypatch):
    """After the first call of a kind, dispatch answers from its memo without deciding again; a call that
    differs in anything a decision depends on (grad mode, dtype, row length, threads) is decided on its own."""
    from normlab import functional as F

    dispatch = importlib.import_module("normlab.kernels.dispatch")  # the module (the package exports the function)
    _rigged(monkeypatch, "native")
    decided = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda *a, **k: decided.append(a[1:2]) or real(*a, **k))
    x = torch.randn(6, 768)
    with torch.no_grad():
        for _ in range(3):
            F.layer_norm(x, 768)
    assert len(decided) == 1 and set(tuner.routes.values()) == {"native"}
    w = torch.ones(768, requires_grad=True)
    y = F.layer_norm(x, 768, w)  # autograd records: another route
    y.sum().backward()
    assert len(decided) == 2
    F.layer_norm(x.bfloat16(), 768, w.detach().bfloat16().requires_grad_())  # another dtype
    assert len(decided) == 3 and "cpu" in tuner.routes.values()  # torch's kernel takes no half rows
    F.layer_norm(torch.randn(6, 767), 767, torch.ones(767, requires_grad=True))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        F.layer_norm(x, 768, w)
    finally:
        torch.set_num_threads(threads)
    assert len(decided) == 5


def test_the_decision_file_is_the_one_the_environment_names(tmp_path, monkeypatch):
    """``NORMLAB_DISPATCH_FILE`` moves the decisions (the test suite's own file, so that its timings never become
    the user's); unset, they are kept beside the built kernels."""
    monkeypatch.setenv(autotune.FILE_ENV, str(tmp_path / "elsewhere.json"))
    assert autotune.Tuner().path == tmp_path / "elsewhere.json"
    assert autotune.Tuner(tmp_path / "given.json").path == tmp_path / "given.json"  # an explicit path wins
    monkeypatch.delenv(autotune.FILE_ENV)
    assert autotune.Tuner().path == autotune.build.cache_dir() / "dispatch.json"


def test_this_test_run_keeps_its_decisions_away_from_the_users_file():
    assert autotune.TUNER.path != autotune.build.cache_dir() / "dispatch.json"


def test_machine_follows_the_kernels_build_and_torchs_instruction_set(monkeypatch):
    """Decisions measured with kernels compiled for another target, or with torch limited to another instruction
    set (``ATEN_CPU_CAPABILITY``), are not this configuration's."""
    if build.compiler() is None:
        pytest.skip("no C++ compiler: no kernels to build")
    base = autotune.machine()
    try:
        monkeypatch.setenv("NORMLAB_CXXFLAGS", "-march=x86-64")
        autotune._build_key.cache_clear()
        assert autotune.machine()["build"] != base["build"]
    finally:
        monkeypatch.undo()
        autotune._build_key.cache_clear()
    assert autotune.machine() == base
    other = "DEFAULT" if base["torch_isa"] != "DEFAULT" else "AVX2"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    assert autotune.machine()["torch_isa"] == other != base["torch_isa"]


@needs_two
def test_a_close_call_is_timed_again_and_each_keeps_its_fastest(tuner, monkeypatch):
    """A decision is kept for good: where the first rounds put the two fastest within ``CLOSE``, a second sample
    is timed, and each candidate keeps its fastest round of both; a clear first timing is not repeated."""
    rounds = iter([{"cpu": 1.1, "native": 1.0}, {"cpu": 0.6, "native": 1.05}])  # a slow first round for cpu
    timed = []

    def fake(cands, op, x, d, eps, backward=True):
        timed.append(op)
        return next(rounds), f"4x{d}"

    monkeypatch.setattr(autotune, "_time", fake)
    dec = autotune.TUNER.choose("add_layer_norm", torch.randn(4, 768), 768, 1e-5,
                                {"cpu": None, "native": None}, "cpu")
    assert (dec.impl, dec.ms, len(timed)) == ("cpu", {"cpu": 0.6, "native": 1.0}, 2)
    monkeypatch.setattr(autotune, "_time", lambda *a, **k: (timed.append("clear"), ({"cpu": 0.5, "native": 1.0},
                                                                                    "4x256"))[1])
    assert autotune.TUNER.choose("layer_norm", torch.randn(4, 256), 256, 1e-5, {"cpu": None, "native": None},
                                 "cpu").impl == "cpu"
    assert timed.count("clear") == 1


@needs_two
def test_a_save_that_cannot_replace_the_file_leaves_no_temporary_file(tuner, monkeypatch):
    """Where the decision file cannot be replaced (here a folder stands at its path; a full disk alike), each
    save left a ``tmp*.json`` behind."""
    tuner.path.mkdir()
    _rigged(monkeypatch, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the folder cannot be read as a cache either: one warning)
        for d in (64, 80, 96):
            assert kernels.resolve("auto", "layer_norm", torch.randn(4, d), 1e-5) == "cpu"
    assert sorted(p.name for p in tuner.path.parent.iterdir()) == ["dispatch.json", "dispatch.json.lock"]


@needs_two
def test_saves_wait_for_each_other(tuner, monkeypatch):
    """Each save reads the file, merges and replaces it: two processes saving at once each dropped the other's
    new decisions. A save now holds a lock beside the file for its read and write."""
    import fcntl
    import threading
    import time

    _rigged(monkeypatch, "cpu")
    tuner.path.parent.mkdir(parents=True, exist_ok=True)
    with open(tuner.path.with_name("dispatch.json.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process saving
        done = threading.Thread(target=kernels.resolve, args=("auto", "layer_norm", torch.randn(4, 64), 1e-5))
        done.start()
        time.sleep(0.5)
        assert not tuner.path.exists()  # the decision is taken, its save waits
        fcntl.flock(held, fcntl.LOCK_UN)
        done.join(timeout=30)
    assert list(json.loads(tuner.path.read_text())["configs"][0]["decisions"])  # then written


@needs_two
def test_a_save_does_not_wait_forever_for_a_lock(tuner, monkeypatch):
    """A process that holds the lock and never lets go (stopped) hung every later ``auto`` call that saved."""
    import fcntl

    _rigged(monkeypatch, "cpu")
    monkeypatch.setattr(autotune, "LOCK_WAIT_S", 0.2)
    tuner.path.parent.mkdir(parents=True, exist_ok=True)
    waits, locked = [], build._locked

    def timed(fd, wait_s):
        waits.append(wait_s)
        return locked(fd, wait_s)

    monkeypatch.setattr(build, "_locked", timed)
    with open(tuner.path.with_name("dispatch.json.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # never released during the calls
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
        assert tuner.path.exists()  # written after the wait
        # the next kind of call tries the lock once: it waited LOCK_WAIT_S again for every decision (5 s each)
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 1024), 1e-5) == "cpu"
        assert waits == [0.2, 0.0]
    assert kernels.resolve("auto", "layer_norm", torch.randn(4, 4096), 1e-5) == "cpu"  # let go: held again
    assert waits[-1] == 0.0 and not tuner.lock_stuck
    assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64, dtype=torch.float64), 1e-5) == "cpu"
    assert waits[-1] == 0.2 and len(json.loads(tuner.path.read_text())["configs"][0]["decisions"]) == 4


@needs_two
def test_a_linked_cache_file_is_written_through_its_link(tmp_path, monkeypatch):
    """NORMLAB_DISPATCH_FILE naming a link (to a file kept elsewhere, a team's shared cache): the first save
    renamed its file over the link, which became a file of its own, and the file it pointed to was never
    written."""
    kept = tmp_path / "shared" / "dispatch.json"
    kept.parent.mkdir()
    link = tmp_path / "dispatch.json"
    link.symlink_to(kept)
    monkeypatch.setenv(autotune.FILE_ENV, str(link))
    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner())
    monkeypatch.setattr(autotune, "_enabled", True)
    _rigged(monkeypatch, "cpu")
    assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert link.is_symlink() and link.resolve() == kept.resolve()
    assert list(json.loads(kept.read_text())["configs"][0]["decisions"])


@needs_two
def test_a_named_file_that_cannot_be_read_is_left_as_it_is(tmp_path, monkeypatch):
    """NORMLAB_DISPATCH_FILE naming a file normlab may not read (mode 000): it was replaced by the decisions,
    readable by everyone, the user's text gone."""
    import pathlib

    mine = tmp_path / "notes.txt"
    mine.write_text("my private notes\n")
    real = pathlib.Path.read_bytes

    def refused(self):  # (the tests may run as root, who reads mode 000)
        if self == mine:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", refused)
    monkeypatch.setenv(autotune.FILE_ENV, str(mine))
    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner())
    monkeypatch.setattr(autotune, "_enabled", True)
    _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match=r"notes.txt: it cannot be read \(Permission denied\); it is left as it"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert mine.read_text() == "my private notes\n" and autotune.TUNER.unsaved.startswith(str(mine))


@needs_two
def test_a_cache_too_large_or_not_a_file_is_not_read(tuner, monkeypatch):
    """A corrupt 1 GB cache was read whole, twice (2.3 GB, 11 s; a MemoryError under a memory limit); a FIFO
    blocked the first call for good."""
    import os

    _rigged(monkeypatch, "cpu")
    with open(tuner.path, "wb") as f:
        f.truncate(autotune.MAX_FILE_BYTES + 1)  # sparse: no disk used
    read = []
    monkeypatch.setattr(type(tuner.path), "read_bytes", lambda self: read.append(self) or b"")
    with pytest.warns(RuntimeWarning, match=f"it is {autotune.MAX_FILE_BYTES + 1} bytes, larger than any dispatch"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert read == [] and tuner.path.stat().st_size < 10_000  # (normlab's own cache: replaced)
    monkeypatch.undo()
    monkeypatch.setattr(autotune, "_enabled", True)
    _rigged(monkeypatch, "cpu")
    fifo = tuner.path.with_name("pipe")
    os.mkfifo(fifo)
    monkeypatch.setenv(autotune.FILE_ENV, str(fifo))
    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner())
    with pytest.warns(RuntimeWarning, match="pipe: it is not a regular file; it is left as it is"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"


@needs_two
def test_a_damaged_section_drops_alone(tuner, monkeypatch):
    """One bad decision in this configuration's section made the rewrite drop every other configuration's."""
    x = torch.randn(4, 64)
    entry = {"impl": "native", "why": "measured", "ms": {"cpu": 9.0, "native": 1.0}, "sample": "4x64", "cost_ms": 1}
    other = {"machine": {**autotune.machine(), "torch": "2.0.0"}, "decisions": {"k": entry}}
    bad = {"machine": autotune.machine(), "decisions": {autotune.key("layer_norm", x, 64): {"impl": "cpu",
                                                                                          "ms": {"cpu": "1.0"}}}}
    tuner.path.write_text(json.dumps({"format": autotune.FORMAT, "configs": [bad, other]}))
    _rigged(monkeypatch, "cpu")
    with pytest.warns(RuntimeWarning, match="not a valid dispatch cache"):
        assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "cpu"
    assert json.loads(tuner.path.read_text())["configs"][1:] == [other]


@needs_two
def test_processes_that_measure_at_once_run_the_decision_saved_first(tuner, monkeypatch):
    """Two processes deciding on a cold cache together ran `cpu` and `native` for one call (their bits differing),
    and the file kept the last writer's: the later one takes the decision saved while it measured."""
    x = torch.randn(4, 64)
    k = autotune.key("layer_norm", x, 64)
    entry = {"impl": "native", "why": "measured", "ms": {"cpu": 9.0, "native": 1.0}, "sample": "4x64", "cost_ms": 1}

    def measured_while_another_saved(cands, op, x, d, eps, backward=True):
        section = {"machine": autotune.machine(), "decisions": {k: entry}}
        tuner.path.write_text(json.dumps({"format": autotune.FORMAT, "configs": [section]}))
        return {n: (0.1 if n == "cpu" else 1.0) for n in cands}, f"4x{d}"

    monkeypatch.setattr(autotune, "_time", measured_while_another_saved)
    assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "native"
    assert kernels.resolve("auto", "layer_norm", x, 1e-5) == "native"  # and kept for the process
    assert json.loads(tuner.path.read_text())["configs"][0]["decisions"][k]["impl"] == "native"


@needs_two
def test_a_link_that_loops_or_points_at_no_file_is_left_as_it_is(tuner, monkeypatch):
    """A cache that is a link looping on itself stopped the first ``auto`` call with Path.resolve's RuntimeError;
    one to a FIFO (or any file that is no regular file) was replaced by the decisions, the FIFO gone."""
    import os
    import stat

    _rigged(monkeypatch, "cpu")
    tuner.path.symlink_to(tuner.path.name)  # dispatch.json -> dispatch.json
    with pytest.warns(RuntimeWarning, match="dispatch.json: it cannot be read"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    tuner.path.unlink()
    fifo = tuner.path.with_name("pipe")
    os.mkfifo(fifo)
    tuner.path.symlink_to(fifo)
    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner(tuner.path))
    with pytest.warns(RuntimeWarning, match="dispatch.json: it is not a regular file; it is left as it is"):
        assert kernels.resolve("auto", "layer_norm", torch.randn(4, 64), 1e-5) == "cpu"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and tuner.path.is_symlink()


@needs_two
def test_torch_func_transforms_decide_by_the_fixed_table(tuner, monkeypatch):
    """Under vmap or grad, decide timed a sample: vmap refused its random draw, grad its storage-less tensors."""
    calls = _rigged(monkeypatch, "native")
    seen = []

    def f(t):
        seen.append(kernels.decide("auto", "layer_norm", t, 1e-5))
        return t.sum()

    torch.func.vmap(f)(torch.randn(3, 4, 768))
    torch.func.grad(f)(torch.randn(4, 768))
    assert calls == [] and [d.why.startswith("fixed table (no timer") for d in seen] == [True, True]
