"""Study runner: versioned cell keys, kept divergences, metrics beside the store, the Ray executor and resume."""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import pathlib
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
import torch

from normlab import tracking
from normlab.studies import runner as runner_mod
from normlab.studies.runner import Runner, Store, cell_key

HERE = pathlib.Path(__file__).parent


def counted_cell(cfg: dict) -> dict:
    """Appends its x to ``cfg["log"]`` (one line per execution), optionally sleeps; diverges when asked."""
    with open(cfg["log"], "a") as f:
        f.write(f"{cfg['x']}\n")
    time.sleep(cfg.get("sleep", 0))
    for step in range(1, 4):
        tracking.log_step(step, 1.0 / step, 1e-3, 0.1, 0.0)
    if cfg.get("diverge"):
        return {"status": "diverged", "diverged_step": 3, "final_loss": None}
    return {"y": cfg["x"] ** 2}


def dying_cell(cfg: dict) -> dict:
    """Kills its own worker process (as the kernel's out-of-memory killer or a ``kill -9`` would) when asked."""
    if cfg.get("die"):
        os._exit(9)
    return {"y": cfg["x"]}


def executions(log: pathlib.Path) -> dict[int, int]:
    lines = log.read_text().split() if log.exists() else []
    return {int(x): lines.count(x) for x in set(lines)}


def test_a_diverged_cell_is_a_result_kept_across_resumes(tmp_path):
    log = tmp_path / "runs.log"
    cfgs = [{"x": 1, "log": str(log), "diverge": True}, {"x": 2, "log": str(log)}]
    first = Runner(Store(str(tmp_path / "runs.sqlite"))).map("demo", counted_cell, cfgs)
    assert first[0]["status"] == "diverged" and first[0]["diverged_step"] == 3
    again = Runner(Store(str(tmp_path / "runs.sqlite")))
    second = again.map("demo", counted_cell, cfgs)
    assert again.ran == 0 and second == first
    assert executions(log) == {1: 1, 2: 1}  # the diverged cell was not trained again


def test_a_full_disk_under_a_sound_store_is_said_not_called_a_damaged_store(tmp_path, monkeypatch):
    """On a full disk SQLite reads "disk I/O error": the store was called "not a normlab store ... move it away"
    (or "damaged"), which had the user throw away finished cells."""
    from normlab._checks import BadValue
    from normlab.studies import runner

    db = tmp_path / "runs.sqlite"
    store = Store(str(db))
    store.put("k", "s", "f", {}, {"v": 1}, 0.0)

    def failing(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(runner.sqlite3, "connect", failing)
    for use in (lambda: Store(str(db)), lambda: store.get("k")):  # opening it, and a cell read from it after
        with pytest.raises(BadValue) as e:
            use()
        assert "make room on its disk" in str(e.value) and "move it away" not in str(e.value)


@pytest.mark.parametrize("content", ["text", "sqlite"])
def test_a_file_of_the_users_under_the_stores_name_is_refused_and_left_as_it_was(tmp_path, content):
    """A text file, or someone's own SQLite database, named runs.sqlite: one line, and the file unchanged (the
    store added its tables to a database of the user's)."""
    from normlab._checks import BadValue

    db = tmp_path / "runs.sqlite"
    if content == "text":
        db.write_text("my notes")
    else:
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            con.execute("CREATE TABLE expenses (item TEXT, cost REAL)")
    before = db.read_bytes()
    with pytest.raises(BadValue, match="runs.sqlite is not a normlab store"):
        Store(str(db))
    assert db.read_bytes() == before
    empty = tmp_path / "new.sqlite"
    Store(str(empty)).put("k", "s", "f", {}, {"v": 1}, 0.0)
    assert Store(str(empty)).get("k") == {"status": "ok", "v": 1}  # normlab's own store opens again


def test_cell_key_follows_source_and_version(tmp_path, monkeypatch):
    mod = tmp_path / "cellmod_v.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    mod.write_text("def cell(cfg):\n    return {'y': cfg['x']}\n")
    old = cell_key(importlib.import_module("cellmod_v").cell, {"x": 1})
    mod.write_text("def cell(cfg):\n    return {'y': cfg['x'] + 1}  # edited\n")
    sys.modules.pop("cellmod_v")
    assert cell_key(importlib.import_module("cellmod_v").cell, {"x": 1}) != old  # an edited cell: new results
    before = cell_key(counted_cell, {"x": 1})
    monkeypatch.setattr(runner_mod, "__version__", "999.0")
    assert cell_key(counted_cell, {"x": 1}) != before  # nor does a new normlab version


def test_cell_key_follows_the_code_the_cell_calls(tmp_path, monkeypatch):
    """A cell's own source does not show an edit to the model or kernel it calls: normlab's source is keyed too
    (an edited helper reused every stored result while the version string stayed the same)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("X = 1\n")
    (pkg / "sub" / "k.cpp").write_text("int f() { return 1; }\n")
    (pkg / "notes.md").write_text("not code\n")
    first = runner_mod.code_digest(pkg)
    (pkg / "notes.md").write_text("edited, still not code\n")
    runner_mod.code_digest.cache_clear()
    assert runner_mod.code_digest(pkg) == first
    (pkg / "sub" / "k.cpp").write_text("int f() { return 2; }\n")
    runner_mod.code_digest.cache_clear()
    assert runner_mod.code_digest(pkg) != first
    runner_mod.code_digest.cache_clear()
    before = cell_key(counted_cell, {"x": 1})
    monkeypatch.setattr(runner_mod, "code_digest", lambda: "another build")
    assert cell_key(counted_cell, {"x": 1}) != before


def test_training_rows_are_written_beside_the_store(tmp_path):
    r = Runner(Store(str(tmp_path / "runs.sqlite")))
    r.map("demo", counted_cell, [{"x": 3, "log": str(tmp_path / "log")}])
    (csv,) = (tmp_path / "metrics" / "demo").glob("counted_cell-*.csv")
    assert [row["step"] for row in tracking.read(csv)] == [1, 2, 3]
    made = json.loads(csv.with_suffix(".json").read_text())  # what made them, beside them
    assert made["config"]["x"] == 3 and made["cell"] == "counted_cell" and csv.stem.endswith(made["key"][:12])
    assert made["versions"]["torch"] == torch.__version__ and made["versions"]["source_digest"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_is_one_line_and_leaves_the_store(tmp_path, capsys):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'normlab[scale]')")
    db = tmp_path / "runs.sqlite"
    cfgs = [{"x": i, "log": str(tmp_path / "log")} for i in range(3)]
    Runner(Store(str(db))).map("demo", counted_cell, cfgs[:2])
    address = f"127.0.0.1:{_free_port()}"
    with pytest.raises(ConnectionError, match=f"cannot reach a Ray cluster at {address}") as e:
        Runner(Store(str(db)), executor="ray", address=address).map("demo", counted_cell, cfgs)
    assert "\n" not in str(e.value)
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert Store(str(db)).count() == 2
    from normlab.cli import main

    code = main(["report", "--executor", "ray", "--address", address, "--only", "invariance",
                 "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot reach a Ray cluster" in err
    assert not (tmp_path / "rep").exists()  # said before the report made its folder and store


def test_address_auto_without_a_cluster_is_one_line_before_the_folder(tmp_path, capsys, monkeypatch):
    """``--address auto`` was not checked before the report made its folder, lock and store."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'normlab[scale]')")
    from ray._private.services import find_gcs_addresses

    if find_gcs_addresses():
        pytest.skip("a Ray cluster runs on this machine")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))  # no ray_current_cluster file of another run
    from normlab.cli import main

    code = main(["report", "--executor", "ray", "--address", "auto", "--only", "invariance",
                 "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--address auto: Could not find any running Ray instance" in err
    assert not (tmp_path / "rep").exists()
    from normlab.studies.ray_executor import check_ready

    monkeypatch.setenv("RAY_ADDRESS", "ray://127.0.0.1:10001")  # Ray Client mode: ray.init connects, not checked here
    check_ready("auto")


def test_a_ray_client_address_is_checked_before_the_report_makes_its_folder(tmp_path, capsys):
    """``ray://HOST:PORT`` skipped the check: the report made its folder, lock and store with a session row, then
    ray.init timed out after 30 s. Now one line before anything is written, as for HOST:PORT."""
    import time

    pytest.importorskip("ray", reason="Ray is not installed (pip install 'normlab[scale]')")
    from normlab.cli import main
    from normlab.studies.ray_executor import _check_reachable

    address = f"ray://127.0.0.1:{_free_port()}"
    for given, said in ((address, f"cannot reach a Ray cluster at {address}: "),
                        ("ray://", "--address must be auto, HOST:PORT or ray://HOST[:PORT]")):
        t0 = time.monotonic()
        code = main(["report", "--executor", "ray", "--address", given, "--only", "invariance",
                     "--out", str(tmp_path / "rep")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and said in err, err
        assert not (tmp_path / "rep").exists() and time.monotonic() - t0 < 20
    with pytest.raises(ConnectionError, match="cannot reach a Ray cluster at ray://127.0.0.1"):
        _check_reachable("ray://127.0.0.1", timeout=1.0)  # no port: the client server's, 10001 (nothing there)


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"SSH-2.0-OpenSSH_9.2\r\n", None])
def test_an_address_that_is_not_a_ray_cluster_is_one_line_not_minutes_of_retries(reply, capsys):
    """A web server, an SSH daemon, a port that accepts and says nothing: Ray's own client retried for minutes,
    printing a warning every few seconds; now one line before Ray starts."""
    import threading

    from normlab.studies import ray_executor

    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def answer():
        conn, _ = server.accept()
        with conn:
            if reply is not None:
                conn.sendall(reply)
            conn.recv(1024)

    threading.Thread(target=answer, daemon=True).start()
    with server, pytest.raises(ConnectionError, match=f"{address} answers, but not as a Ray cluster's head") as e:
        ray_executor._check_reachable(address, timeout=1.0)
    assert "\n" not in str(e.value)


def test_a_ray_clusters_head_passes_the_address_check():
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'normlab[scale]')")
    script = ("import ray\nfrom normlab.studies.ray_executor import _check_reachable\n"
              "ray.init(num_cpus=1, include_dashboard=False)\n"
              "_check_reachable(ray.get_runtime_context().gcs_address)\nprint('joined')\nray.shutdown()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 0 and done.stdout.strip().endswith("joined"), done.stderr[-2000:]


def test_a_report_on_ray_without_ray_says_so_before_it_makes_its_store(tmp_path, monkeypatch, capsys):
    import importlib.util

    from normlab.cli import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    code = main(["report", "--executor", "ray", "--only", "invariance", "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err == "normlab report: error: --executor ray needs Ray: pip install 'normlab[scale]'\n"
    assert not (tmp_path / "rep").exists()


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from normlab.studies.runner import Runner, Store
from test_runner import counted_cell
cfgs = [{{"x": i, "log": {log!r}, "sleep": 0.3}} for i in range({n})]
Runner(Store({db!r}), jobs=2, executor="ray").map("demo", counted_cell, cfgs)
"""


def test_ray_run_killed_then_resumed_locally_loses_nothing_and_repeats_nothing(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'normlab[scale]')")
    n, db, log = 12, tmp_path / "runs.sqlite", tmp_path / "runs.log"
    script = DRIVER.format(tests=str(HERE), log=str(log), n=n, db=str(db))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:  # wait until some cells are stored
        if db.exists() and Store(str(db)).count() >= 3:
            break
        time.sleep(0.2)
    assert driver.poll() is None, f"the Ray driver ended before it was killed: {driver.stderr.read()[-2000:]}"
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray instance it started
    driver.wait()
    with sqlite3.connect(db) as con:
        finished = {json.loads(c)["x"] for (c,) in con.execute("SELECT config FROM cells")}
    assert 3 <= len(finished) < n
    ran_by_ray = executions(log)
    cfgs = [{"x": i, "log": str(log), "sleep": 0.3} for i in range(n)]
    local = Runner(Store(str(db)), jobs=2)  # one thread per cell, as on Ray: the same keys
    results = local.map("demo", counted_cell, cfgs)
    assert [r["y"] for r in results] == [i * i for i in range(n)]  # no finished cell lost
    assert local.ran == n - len(finished)  # only the missing cells ran
    total = executions(log)
    for x in finished:  # a cell finished on Ray never ran again
        assert total[x] == 1 == ran_by_ray[x]


def test_device_is_part_of_the_key_and_provenance_is_recorded(tmp_path):
    from normlab import provenance
    from normlab.studies.report import render_html

    cfg = {"x": 1}
    assert cell_key(counted_cell, cfg, "cuda:0") != cell_key(counted_cell, cfg) == cell_key(counted_cell, cfg, "cpu")
    record = provenance.record()
    assert all(isinstance(record[k], str) for k in ("normlab", "torch", "python"))
    assert isinstance(record["threads"], int) and record["machine"]["cpus"] >= 1
    store = Store(str(tmp_path / "runs.sqlite"))
    store.add_session(record)
    with sqlite3.connect(tmp_path / "runs.sqlite") as con:
        (saved,) = con.execute("SELECT provenance FROM sessions").fetchone()
    assert json.loads(saved)["torch"] == record["torch"]
    page = render_html({"claims": [], "studies": [], "scale": "test", "seconds": 0, "cells_computed": 0,
                        "provenance": record}, tmp_path)
    assert f"torch {record['torch']}" in page and f"normlab {record['normlab']}" in page


def threads_cell(cfg: dict) -> dict:
    """What a cell sees of torch's settings."""
    import torch

    return {"threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled()}


def test_the_thread_count_is_part_of_the_key(tmp_path):
    """Float results depend on the thread count: a store filled with --jobs 1 (2 threads per cell) is not
    reused by --jobs 2 (1 thread per cell); 1 thread keeps the keys it always had."""
    cfg = {"x": 1}
    assert cell_key(threads_cell, cfg, threads=1) == cell_key(threads_cell, cfg)
    assert cell_key(threads_cell, cfg, threads=2) != cell_key(threads_cell, cfg)
    db = str(tmp_path / "runs.sqlite")
    alone = Runner(Store(db), jobs=1)
    assert alone.threads == 2 and alone.map("demo", threads_cell, [cfg]) == [
        {"status": "ok", "threads": 2, "deterministic": True}]
    beside = Runner(Store(db), jobs=2)
    assert beside.threads == 1 and beside.map("demo", threads_cell, [cfg])[0]["threads"] == 1
    assert beside.ran == 1 and Store(db).count() == 2


def test_a_cell_runs_deterministic_and_leaves_the_settings_as_it_found_them():
    import torch

    threads = torch.get_num_threads()
    result, _, _ = runner_mod._call(__name__, "threads_cell", {}, threads=1)
    assert result == {"threads": 1, "deterministic": True}
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()


def dispatch_cell(cfg: dict) -> dict:
    """Which kernel ``auto`` gives a cell for a float32 LayerNorm of rows of 64, and why."""
    import torch

    dispatch = importlib.import_module("normlab.kernels.dispatch")  # the module (kernels.dispatch is its function)
    dec = dispatch.decide("auto", "layer_norm", torch.randn(4, 64), 1e-5)
    return {"impl": dec.impl, "why": dec.why}


def test_a_cell_runs_on_the_fixed_dispatch_table_and_leaves_autotune_as_it_was(monkeypatch):
    """``auto`` times two kernels where both can run a call and keeps the faster; a tie goes either way with the
    machine's load, and the kernels round differently, so a cell's numbers could change from run to run on one
    machine. A cell uses the fixed table."""
    from normlab.kernels import autotune

    monkeypatch.setattr(autotune, "_enabled", True)
    result, _, _ = runner_mod._call(__name__, "dispatch_cell", {}, threads=1)
    assert result["why"].startswith("fixed table"), result
    assert autotune.enabled()


def test_a_worker_that_dies_is_one_line_and_the_finished_cells_are_kept(tmp_path):
    """A worker killed mid-sweep surfaced as BrokenProcessPool: a traceback and "a bug in normlab"."""
    from normlab._checks import Unavailable

    store = Store(str(tmp_path / "runs.sqlite"))
    Runner(store, jobs=2).map("demo", dying_cell, [{"x": 0}, {"x": 1}])
    with pytest.raises(Unavailable, match="a worker process died .* run the same command again to resume"):
        Runner(store, jobs=2).map("demo", dying_cell, [{"x": 0}, {"x": 1}, {"x": 2, "die": True}, {"x": 3}])
    assert store.count() >= 2  # what had finished is there for the rerun


def test_a_store_damaged_after_it_was_opened_is_one_line(tmp_path, monkeypatch):
    """Only a store unreadable at open time was one line; damage found by a later read was a traceback."""
    from normlab._checks import UserError

    store = Store(str(tmp_path / "runs.sqlite"))

    class Damaged:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def execute(self, *args):
            raise sqlite3.DatabaseError("database disk image is malformed")

        def close(self):
            pass

    monkeypatch.setattr(store, "_connect", Damaged)
    with pytest.raises(UserError, match="runs.sqlite is damaged .*malformed.*move it away"):
        store.get("any key")


def test_a_cell_whose_stored_result_was_damaged_is_one_line(tmp_path):
    """A row's JSON changed on disk (the file itself still a database) was a JSONDecodeError traceback."""
    from normlab._checks import UserError

    store = Store(str(tmp_path / "runs.sqlite"))
    store.put("k", "s", "f", {}, {"deviation": 1.0}, 0.0)
    with contextlib.closing(sqlite3.connect(tmp_path / "runs.sqlite")) as con, con:
        con.execute("UPDATE cells SET result = '{broken' WHERE key = 'k'")
    with pytest.raises(UserError, match=r"runs.sqlite is damaged \(cell k: .*move it away"):
        store.get("k")


def test_a_cell_whose_stored_result_was_edited_into_other_json_is_one_line(tmp_path):
    """Valid JSON that is not what the cell returned (a hand-edited or foreign row) reached the study, whose
    reading of its keys stopped with a KeyError traceback."""
    from normlab._checks import UserError

    store = Store(str(tmp_path / "runs.sqlite"))
    store.put("k", "s", "f", {}, {"deviation": 1.0}, 0.0)
    assert store.get("k") == {"status": "ok", "deviation": 1.0}
    for edit in ('{"x": 1}', '{"deviation": 2.0}', "[1, 2]"):
        with contextlib.closing(sqlite3.connect(tmp_path / "runs.sqlite")) as con, con:
            con.execute("UPDATE cells SET result = ? WHERE key = 'k'", (edit,))
        with pytest.raises(UserError, match=r"runs.sqlite is damaged \(cell k: .*move it away"):
            store.get("k")


def test_a_store_that_refuses_writes_is_one_line(tmp_path, monkeypatch):
    """A store file that can be read but not written (an immutable file; root ignores chmod) failed at the first
    write with sqlite's OperationalError traceback."""
    from normlab._checks import UserError

    path = tmp_path / "runs.sqlite"
    Store(str(path)).put("k", "s", "f", {}, {"v": 1}, 0.0)
    read_only = lambda: sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)  # noqa: E731
    store = Store(str(path))
    monkeypatch.setattr(store, "_connect", read_only)
    assert store.get("k") == {"status": "ok", "v": 1}
    with pytest.raises(UserError, match="runs.sqlite: cannot write there .*readonly.*give --out another folder"):
        store.add_session({"who": "me"})
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "runs.sqlite").mkdir()
    with pytest.raises(UserError, match="runs.sqlite is a folder where the store goes"):
        Store(str(tmp_path / "folder" / "runs.sqlite"))


def test_two_reports_in_one_folder_the_second_is_refused(tmp_path):
    """Two reports into one --out each wrote results.json from what they read at their start (one's claims lost),
    or one found the other's store half made ("not a normlab store")."""
    from normlab._checks import UserError
    from normlab.locks import folder_lock
    from normlab.studies.report import run_studies

    out = tmp_path / "report"
    out.mkdir()
    (out / ".lock").write_text("my notes\n")  # a file of the user's under a common name: the lock's was that
    with folder_lock(out, "written", "wait"):  # another report holds the folder
        with pytest.raises(UserError, match=f"{out} is being written by process {os.getpid()}"):
            run_studies(out, scale="test", only=["lesson_stats"], progress=False)
    assert not (out / "runs.sqlite").exists()
    assert (out / ".lock").read_text() == "my notes\n"


def test_a_ray_address_in_the_environment_does_not_stop_the_local_instance(tmp_path):
    """Without --address normlab starts its own Ray, but ray.init read RAY_ADDRESS (common on Ray machines),
    then refused num_cpus there: a traceback and "a bug in normlab" after the store was made."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'normlab[scale]')")
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-m", "normlab", "study", "structure", "--executor", "ray", "--jobs", "1",
                           "--out", str(tmp_path / "rep")], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_ray_task_error_is_recorded_by_its_cause_without_colour_codes():
    """A task that failed outside its cell (a module missing on a node) was recorded as Ray's coloured header,
    "RayTaskError(ModuleNotFoundError): \\x1b[36mray::_call()\\x1b[39m (pid=...)", its cause gone."""
    from normlab.studies.ray_executor import _first_line

    assert _first_line(RuntimeError("\x1b[36mray::_call()\x1b[39m (pid=1)\nmore")) == "ray::_call() (pid=1)"


def test_a_resumed_report_finds_its_diarization_cells_however_out_is_spelled(tmp_path, monkeypatch):
    """The cells' key held the data folder as typed: --out rep, then --out /abs/rep (or rep from another folder)
    trained every placement again (about 25 CPU minutes at full size). Simulation, training and scoring stubbed."""
    import normlab.diarization.data.dataset as dataset
    import normlab.diarization.training.recipe as recipe
    import normlab.studies.diarization as dz
    from normlab.studies.report import run_studies

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/bin/true")  # as if espeak-ng were installed
    monkeypatch.setattr(recipe, "simulate_splits", lambda *a, **k: None)
    monkeypatch.setattr(dataset, "MixtureSet", lambda *a, **k: None)
    monkeypatch.setattr(recipe, "train_model", lambda data, tmp, rc: (None, [0.5] * 30))
    monkeypatch.setattr(recipe, "score_model", lambda model, data: {
        "test": {"collar_0.25": {"der": 0.1}, "collar_0": {"der": 0.2}}})
    monkeypatch.setattr(dz, "real_persons", lambda: False)
    monkeypatch.chdir(tmp_path)
    computed = [run_studies(out, scale="quick", jobs=1, only=["diarization"], progress=False)["cells_computed"]
                for out in ("rep", str(tmp_path / "rep"))]
    assert computed[0] > 0 and computed[1] == 0, computed


def test_a_folder_on_a_file_system_without_locks_is_used_without_one(tmp_path, monkeypatch):
    """flock's ENOLCK (a file system that takes no locks) read as "is being written by ...": whoever wrote the
    lock file last was named as a running holder, and the folder could never be used."""
    import errno
    import fcntl

    from normlab.locks import folder_lock

    real = fcntl.flock

    def no_locks(f, op):
        if op & fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, "No locks available")
        return real(f, op)

    (tmp_path / ".normlab.lock").write_text("process 1 on elsewhere")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with folder_lock(tmp_path, "written", "wait"):
        pass
    monkeypatch.setattr(fcntl, "flock", lambda f, op: (_ for _ in ()).throw(BlockingIOError(errno.EAGAIN, "busy")))
    with pytest.raises(ValueError, match="is being written by process .* on "):
        with folder_lock(tmp_path, "written", "wait"):
            pass


def test_a_lock_whose_block_left_nothing_takes_its_folders_with_it(tmp_path):
    """A training refused before any work (a batch the ranks cannot split, data that cannot be read) left
    ``out/ckpt/.normlab.lock`` and its empty folders behind."""
    from normlab.locks import LOCK, folder_lock

    with pytest.raises(ValueError, match="refused"):
        with folder_lock(tmp_path / "out" / "ckpt", "trained", "wait"):
            raise ValueError("refused before any work")
    assert list(tmp_path.iterdir()) == []
    with folder_lock(tmp_path / "out" / "ckpt", "trained", "wait"):
        (tmp_path / "out" / "ckpt" / "last.pt").write_text("work")
    assert sorted(p.name for p in (tmp_path / "out" / "ckpt").iterdir()) == [LOCK, "last.pt"]
    (tmp_path / "own").mkdir()  # a folder that was there before is the user's: left, lock file and all
    with folder_lock(tmp_path / "own", "trained", "wait"):
        pass
    assert [p.name for p in (tmp_path / "own").iterdir()] == [LOCK]


def test_a_lock_taken_on_a_file_removed_since_is_taken_again_on_the_new_one(tmp_path, monkeypatch):
    """A holder removes the lock file as it finishes; a process that had opened the old file must not believe it
    holds the lock while a third locks the new file."""
    import fcntl

    from normlab import locks

    folder = tmp_path / "f"
    folder.mkdir()
    real, calls = fcntl.flock, []

    def flock(f, op):  # the first file locked is removed and replaced (another holder finishing) just after
        real(f, op)
        if op & fcntl.LOCK_EX and not calls:
            calls.append(os.fstat(f.fileno()).st_ino)
            (folder / locks.LOCK).unlink()
            (folder / locks.LOCK).write_text("")

    monkeypatch.setattr(fcntl, "flock", flock)
    with locks.folder_lock(folder, "trained", "wait"):  # it holds the file the name holds now: it says who holds it
        assert calls and (folder / locks.LOCK).read_text().startswith(f"process {os.getpid()} on ")


def test_a_lock_whose_folder_went_with_the_last_holder_is_taken_there_again(tmp_path, monkeypatch):
    """A holder that left nothing takes its folder with it; a process that had made the folder but not yet opened
    the lock file stopped with FileNotFoundError instead of taking the lock."""
    import builtins

    from normlab import locks

    calls = []

    def racing_open(path, *args, **kw):  # the other holder leaves (and takes the folder) just before the open
        if not calls:
            calls.append(path)
            pathlib.Path(path).parent.rmdir()
        return builtins.open(path, *args, **kw)

    monkeypatch.setattr(locks, "open", racing_open, raising=False)
    with locks.folder_lock(tmp_path / "out" / "ckpt", "trained", "wait"):
        assert calls and (tmp_path / "out" / "ckpt" / locks.LOCK).read_text().startswith(f"process {os.getpid()}")
