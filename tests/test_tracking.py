"""metrics.csv: a resumed run keeps its rows up to the checkpoint, even after a write cut short."""
import pytest

from normlab import tracking


def test_a_row_cut_short_is_dropped_and_the_run_resumes(tmp_path):
    path = tmp_path / "metrics.csv"
    with tracking.MetricsLog(path) as log:
        for step in range(1, 11):
            log.log(step, 1.0 / step, 1e-3, 0.5, step * 0.1)
    with open(path, "a") as f:
        f.write("11,0.9")  # killed (or the disk filled) halfway through a row
    assert [r["step"] for r in tracking.read(path)] == list(range(1, 11))
    with tracking.MetricsLog(path, resume_step=8) as log:  # refused before: "not a normlab metrics file"
        log.log(9, 0.2, 1e-3, 0.5, 1.0)
    assert [r["step"] for r in tracking.read(path)] == list(range(1, 10))
    assert path.read_text().count("\n") == 10  # the header and nine whole rows: the cut row is gone


def test_a_whole_file_reads_every_row(tmp_path):
    path = tmp_path / "metrics.csv"
    tracking.write(path, [{"step": s, "loss": 1.0, "lr": 0.1, "grad_norm": 2.0, "seconds": 0.5} for s in (1, 2)])
    assert [r["step"] for r in tracking.read(path)] == [1, 2]
    with tracking.MetricsLog(path, resume_step=2) as log:
        log.log(3, 0.5, 0.1, 1.0, 1.5)
    assert [r["step"] for r in tracking.read(path)] == [1, 2, 3]


def test_an_empty_file_has_no_rows_and_the_run_resumes(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes(b"")  # a crash after the file was made, before its header reached the disk
    assert tracking.read(path) == []
    with tracking.MetricsLog(path, resume_step=4) as log:  # refused before: "not a normlab metrics file"
        log.log(5, 0.5, 0.1, 1.0, 1.5)
    assert [r["step"] for r in tracking.read(path)] == [5]
    assert path.read_text().splitlines()[0] == ",".join(tracking.COLUMNS)


def test_a_file_that_is_not_text_is_one_line_not_a_traceback(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes(bytes(range(256)))  # someone else's file under the name
    for call in (lambda: tracking.read(path), lambda: tracking.MetricsLog(path, resume_step=3)):
        with pytest.raises(ValueError, match="is not a normlab metrics file .not UTF-8"):
            call()
    assert path.read_bytes() == bytes(range(256))


def test_a_tensorboard_folder_it_cannot_write_is_one_line_and_no_metrics_begun(tmp_path, monkeypatch):
    """A read-only (or immutable) TensorBoard folder failed inside the writer's thread: its traceback, the path as
    bytes, and a metrics.csv begun with its header alone."""
    import tempfile

    import pytest

    from normlab import tracking
    from normlab._checks import UserError

    pytest.importorskip("tensorboard", reason="TensorBoard is an optional extra (normlab[scale])")

    def refused(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    with pytest.raises(UserError, match=r"--tensorboard .*tb: cannot write there \(Read-only file system\)"):
        tracking.MetricsLog(tmp_path / "ckpt" / "metrics.csv", tensorboard=tmp_path / "tb")
    assert not (tmp_path / "ckpt" / "metrics.csv").exists()


def test_a_tensorboard_path_that_is_a_file_is_said_as_one(tmp_path):
    """It read "File exists"."""
    import pytest

    from normlab import tracking
    from normlab._checks import UserError

    pytest.importorskip("tensorboard", reason="TensorBoard is an optional extra (normlab[scale])")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="--tensorboard .*notes.txt is a file, not a folder"):
        tracking.MetricsLog(tmp_path / "metrics.csv", tensorboard=tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_step_is_a_whole_number_or_refused_when_logged(tmp_path):
    """A tensor step was written as "tensor(1)" and a float as "2.0": the run's own log was then "not a normlab
    metrics file" at resume."""
    import pytest
    import torch

    from normlab.tracking import MetricsLog, read

    with MetricsLog(tmp_path / "metrics.csv") as log:
        log.log(torch.tensor(1), 0.5, 1e-3, 1.0, 0.1)
        with pytest.raises(TypeError):
            log.log(2.0, 0.4, 1e-3, 1.0, 0.1)
    assert [r["step"] for r in read(tmp_path / "metrics.csv")] == [1]
    MetricsLog(tmp_path / "metrics.csv", resume_step=5).close()
