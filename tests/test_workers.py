"""Pool workers end quietly on Ctrl-C: the parent reports it once, no worker prints a traceback of its own."""
import subprocess
import sys

SCRIPT = """
import multiprocessing as mp, os, signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from normlab.workers import exit_on_interrupt

def interrupted():
    os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends every process of the group
    return "not reached"

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=exit_on_interrupt) as pool:
        try:
            pool.submit(interrupted).result()
        except BrokenProcessPool:
            print("the worker ended")
"""


def test_an_interrupted_worker_ends_without_a_traceback(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "the worker ended", r.stderr
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr


ORPHANS = """
import multiprocessing as mp, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from normlab.workers import exit_on_interrupt

def pid_then_sleep():
    return os.getpid()

def sleep():
    time.sleep(600)

if __name__ == "__main__":
    pool = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), initializer=exit_on_interrupt)
    pids = {pool.submit(pid_then_sleep).result() for _ in range(4)}
    for _ in range(2):
        pool.submit(sleep)
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(600)
"""


def test_workers_end_with_a_parent_that_is_killed(tmp_path):
    """A parent killed outright (kill -9, a timeout command, out of memory) takes its workers with it: they went on
    running for nobody, each with its own copy of torch (a killed report left 176 of them)."""
    import os
    import pathlib
    import platform
    import signal
    import time

    import pytest

    if platform.system() != "Linux":
        pytest.skip("the parent-death signal is Linux's")
    script = tmp_path / "orphans.py"
    script.write_text(ORPHANS)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    children: set[int] = set()
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert pids and all(os.path.exists(f"/proc/{p}") for p in pids)
        time.sleep(0.5)  # the pool may still be starting a spare worker: it is the parent's child too
        for task in pathlib.Path(f"/proc/{parent.pid}/task").iterdir():
            children |= {int(c) for c in (task / "children").read_text().split()}
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30

    def alive(pid: int) -> bool:  # a process, not yet a zombie
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for p in {*left, *(c for c in children if alive(c))}:  # nothing of this test's outlives it
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers outlived their killed parent: {left}"


ORPHAN_CHILD = """
import os, sys, time
import normlab.workers  # what a rank or a worker imports first thing; torch comes later
print(os.getpid(), flush=True)
while os.getppid() == int(sys.argv[1]):  # its parent dies while it imports torch
    time.sleep(0.01)
normlab.workers.die_with_parent()
time.sleep(60)
"""

MIDDLE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(__import__("os").getpid())], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)  # (the test's pipes closed when this one ends)
print(child.stdout.readline().strip(), flush=True)  # the child is running, then its parent is gone
"""


def test_a_process_whose_parent_died_before_it_asked_ends_too(tmp_path):
    """A rank whose launcher died while the rank still imported torch asked for the parent-death signal with the
    reaper as its parent: the request came too late, the check compared the reaper with itself, and the orphan
    trained on, holding the folder's lock."""
    import os
    import platform
    import signal
    import time

    import pytest

    if platform.system() != "Linux":
        pytest.skip("the parent-death signal is Linux's")
    middle = subprocess.run([sys.executable, "-c", MIDDLE, ORPHAN_CHILD], capture_output=True, text=True, timeout=60)
    child = int(middle.stdout.strip())
    deadline = time.monotonic() + 20

    def alive() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    outlived = alive()
    if outlived:
        os.kill(child, signal.SIGKILL)
    assert not outlived, "the orphan outlived its parent"


SLOW_CELLS = """
import time

def slow_cell(cfg):
    time.sleep(cfg["seconds"])
    return {"slept": cfg["seconds"]}
"""

INTERRUPTED_RUNNER = """
import os, signal, sys, threading, time
from normlab.studies.runner import Runner, Store
from slowcells import slow_cell

if __name__ == "__main__":
    # as in a terminal: a process started in the background by a shell (nohup, `&`) inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    runner = Runner(Store(sys.argv[1]), jobs=2)
    started = time.time()
    threading.Timer(float(sys.argv[2]), lambda: os.kill(os.getpid(), signal.SIGINT)).start()  # this process alone
    try:
        runner.map("demo", slow_cell, [{"seconds": 120, "i": i} for i in range(4)])
    except KeyboardInterrupt:
        print(f"stopped after {time.time() - started:.1f} s", flush=True)
"""


def test_an_interrupt_sent_to_the_parent_alone_stops_its_workers(tmp_path):
    """`kill -INT PID` (the parent only, not the terminal's group) left the workers computing their cells, and
    the queued ones, for as long as they took; then their results were dropped."""
    import re
    import time

    (tmp_path / "slowcells.py").write_text(SLOW_CELLS)
    script = tmp_path / "runner.py"
    script.write_text(INTERRUPTED_RUNNER)
    t0 = time.time()
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "runs.sqlite"), "8"], capture_output=True,
                       text=True, timeout=300)
    assert re.fullmatch(r"stopped after \d+\.\d s", r.stdout.strip()), (r.stdout, r.stderr[-2000:])
    stopped = float(r.stdout.split()[2])
    assert 8 <= stopped < 30 and time.time() - t0 < 60, (stopped, time.time() - t0)  # the cells sleep 120 s


def test_a_command_terminated_stops_as_an_interrupted_one(tmp_path):
    """SIGTERM (kill, timeout, a job scheduler) ended a command with nothing said, and the commands with workers
    printed Python's warning about leaked semaphores; it now stops as Ctrl-C does: one line, exit 143."""
    import os
    import signal
    import time

    out = tmp_path / "report"
    p = subprocess.Popen([sys.executable, "-m", "normlab", "report", "--quick", "--only", "init_depth", "--out",
                          str(out), "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "runs.sqlite").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the cells have started (a signal during the imports would meet Python's default)
    time.sleep(1.0)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert err.strip().splitlines()[-1] == "normlab report: terminated (finished work is kept; re-run to resume)"
    assert "leaked" not in err and "Traceback" not in err, err
    assert os.path.exists(out / "runs.sqlite")
