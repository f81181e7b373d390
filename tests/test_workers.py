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
