"""normlab.written: a file in an output folder is replaced only where normlab wrote it and nobody changed it."""
import pathlib

import pytest

from normlab import written
from normlab.studies.report import run_studies


def test_only_normlab_s_own_unchanged_files_pass(tmp_path):
    mine, theirs = tmp_path / "a.rttm", tmp_path / "b.rttm"
    written.check([mine, theirs])  # nothing there yet
    written.write_text(mine, "x\n")
    theirs.write_text("y\n")
    written.check([mine])
    with pytest.raises(ValueError, match="b.rttm exists and normlab did not write it"):
        written.check([mine, theirs])
    written.check([theirs], overwrite=True)
    mine.write_text("edited\n")  # changed since normlab wrote it: the user's now
    with pytest.raises(ValueError, match="a.rttm exists"):
        written.check([mine])
    written.write_text(mine, "x\n")
    written.write_text(tmp_path / "c.rttm", "z\n")  # the list keeps every file
    written.check([mine, tmp_path / "c.rttm"])
    (tmp_path / written.LIST).write_text("not json")  # an unreadable list: nothing counts as normlab's
    with pytest.raises(ValueError, match="a.rttm exists"):
        written.check([mine])


def test_a_folder_or_a_package_file_is_refused_even_with_overwrite(tmp_path):
    """A folder where an output goes was skipped under --overwrite and found when the output was moved into
    place, after all the work (bench, report, evaluate --html); --overwrite replaced the package's own files."""
    (tmp_path / "bench.md").mkdir()
    for overwrite in (False, True):
        with pytest.raises(ValueError, match="bench.md is a folder where an output would go"):
            written.check([tmp_path / "bench.md"], overwrite=overwrite)
        with pytest.raises(ValueError, match="inside normlab's installed package"):
            written.check([written.PACKAGE / "diarization" / "assets" / "eend_real.json"], overwrite=overwrite)


def test_a_link_loop_is_one_line_too(tmp_path):
    """The package check resolves each output: a looping link raised RuntimeError (a traceback)."""
    (tmp_path / "bench.md").symlink_to(tmp_path / "loop")
    (tmp_path / "loop").symlink_to(tmp_path / "bench.md")
    with pytest.raises(ValueError, match="bench.md exists and normlab did not write it"):
        written.check([tmp_path / "bench.md"])
    written.check([tmp_path / "bench.md"], overwrite=True)


def test_a_name_the_system_refuses_is_one_line(tmp_path):
    """A file name longer than the file system takes raised OSError (errno 36) from the check itself."""
    with pytest.raises(ValueError, match="cannot be written .*give --out another folder"):
        written.check([tmp_path / ("a" * 300) / "results.json"], hint="give --out another folder")


def test_a_link_is_never_written_through(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    link = tmp_path / "out.txt"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="out.txt exists"):
        written.check([link])
    written.write_text(link, "new\n")  # (after --overwrite) the link is replaced, not its target
    assert target.read_text() == "keep\n" and link.read_text() == "new\n" and not link.is_symlink()


def test_a_report_folder_with_someone_else_s_page_stops_before_any_study(tmp_path):
    (tmp_path / "index.html").write_text("<p>my site</p>")
    with pytest.raises(ValueError, match="index.html exists and normlab did not write it"):
        run_studies(tmp_path, only=["lesson_stats"], progress=False)
    assert (tmp_path / "index.html").read_text() == "<p>my site</p>" and not (tmp_path / "runs.sqlite").exists()


def test_a_store_file_of_another_kind_stops_the_report_in_one_line(tmp_path):
    (tmp_path / "runs.sqlite").write_text("my notes, not a database\n" * 100)
    with pytest.raises(ValueError, match="runs.sqlite is not a normlab store") as e:
        run_studies(tmp_path, only=["lesson_stats"], progress=False)
    assert "\n" not in str(e.value) and (tmp_path / "runs.sqlite").read_text().startswith("my notes")


def test_a_kill_inside_a_write_leaves_the_file_normlab_wrote_before(tmp_path, monkeypatch):
    """results.json and index.html were written in place: a kill halfway left half a page, which the next run
    took for someone else's ("exists and normlab did not write it")."""
    import pathlib

    page = tmp_path / "index.html"
    written.write_text(page, "<p>first run</p>\n")
    real = pathlib.Path.write_text

    def killed_halfway(self, text, *args, **kw):
        real(self, text[: len(text) // 2], *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(pathlib.Path, "write_text", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        written.write_text(page, "<p>second run</p>\n" * 100)
    monkeypatch.setattr(pathlib.Path, "write_text", real)
    assert page.read_text() == "<p>first run</p>\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != written.LIST) == ["index.html"]  # no temporary
    written.check([page])  # still normlab's own: the next run replaces it


def test_a_kill_inside_a_figure_save_leaves_the_figure_normlab_saved_before(tmp_path, monkeypatch):
    """A study's figure was saved in place: a Ctrl-C mid-save left a 124-byte PNG that the rerun refused."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from normlab.studies.base import Context, finish

    ctx = Context(None, "quick", tmp_path / "figures")
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    finish(ctx, fig, "demo", "a demo", [])
    first = (tmp_path / "figures" / "demo.png").read_bytes()
    from PIL import Image

    from normlab import __version__

    text = Image.open(tmp_path / "figures" / "demo.png").text  # what made it, inside the file (it said matplotlib)
    assert text["Software"] == f"normlab {__version__}" and "torch" in text["Source"] and "demo" in text["Title"]
    real = Figure.savefig

    def killed_halfway(self, fname, *args, **kw):
        pathlib.Path(fname).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", killed_halfway)
    again = Figure()
    again.add_subplot().plot([1, 0])
    with pytest.raises(KeyboardInterrupt):
        finish(ctx, again, "demo", "a demo", [])
    monkeypatch.setattr(Figure, "savefig", real)
    assert (tmp_path / "figures" / "demo.png").read_bytes() == first
    assert sorted(p.name for p in (tmp_path / "figures").iterdir() if p.name != written.LIST) == ["demo.png"]
    written.check([tmp_path / "figures" / "demo.png"])  # still normlab's own: the next run replaces it


def _write_many(folder: str, prefix: str, n: int, start) -> None:
    start.wait(60)  # both processes write at once
    for i in range(n):
        written.write_text(pathlib.Path(folder) / f"{prefix}{i}.rttm", f"{prefix}{i}\n")


def test_two_processes_writing_into_one_folder_keep_every_entry(tmp_path):
    """``xargs -P 2 normlab diarize ... --out same``: the list was read, changed and replaced through one
    temporary name with no lock, so entries were lost (17 of 200 listed) and calls failed on the other's rename."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), p, 150, start)) for p in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    written.check([tmp_path / f"{p}{i}.rttm" for p in "ab" for i in range(150)])  # every file is normlab's


def test_a_folder_that_cannot_be_written_is_said_before_any_work(tmp_path, monkeypatch, capsys):
    """A read-only --out was found when the first output was written: `diarize` after diarizing (one error per
    file), `bench` after the whole bench. Now one line first. (Root writes anywhere: the refusal is simulated
    where the probe writes.)"""
    import tempfile

    from normlab.cli import main
    from normlab.diarization.pipeline import api

    ro = tmp_path / "ro"
    real = tempfile.TemporaryFile

    def refuse(*a, dir=None, **k):
        if dir is not None and pathlib.Path(dir) == ro:
            raise PermissionError(13, "Permission denied")
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(ValueError, match="--out .*ro: cannot write there .Permission denied"):
        written.writable_folder(ro)
    assert written.writable_folder(tmp_path / "ok" / "deep").is_dir()
    monkeypatch.setattr(api, "_prepare", lambda *a, **k: pytest.fail("work began before the check"))
    (tmp_path / "a.wav").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot write there"):
        api.diarize_files([tmp_path / "a.wav"], ro)
    monkeypatch.setattr("normlab.lab.bench.run", lambda *a, **k: pytest.fail("measured before the check"))
    assert main(["bench", "--out", str(ro), "--shapes", "8x8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write there" in err[0], err


def test_a_folder_that_cannot_be_locked_is_written_without_the_lock(tmp_path, monkeypatch):
    """NFS emulates flock with write locks, which a folder opened to read cannot take: the file was renamed into
    place, then the lock raised, so it was never listed and the next run refused it as the user's."""
    import fcntl

    def refuse(fd, op):
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", refuse)
    written.write_text(tmp_path / "a.rttm", "x\n")
    written.check([tmp_path / "a.rttm"])  # listed: normlab's own


def test_a_killed_report_leaves_the_figures_of_the_report_it_did_not_replace(tmp_path, monkeypatch):
    """A report killed after a study drew its figure (before results.json was written) replaced that figure;
    a later ``--only`` run then showed it beside the verdicts of the run before."""
    pytest.importorskip("matplotlib")
    import base64
    import re

    from normlab.studies import invariance, lesson_stats
    from normlab.studies import report as rep

    monkeypatch.setattr(rep, "STUDIES", ("lesson_stats", "invariance"))
    out, fig = tmp_path / "rep", tmp_path / "rep" / "figures" / "lesson_stats.png"
    run_studies(out, scale="test", progress=False)
    first = fig.read_bytes()
    real_finish = lesson_stats.finish

    def other_figure(ctx, figure, *args):  # a later version of the study draws something else
        figure.suptitle("drawn by the killed run")
        return real_finish(ctx, figure, *args)

    def killed(ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(lesson_stats, "finish", other_figure)
    monkeypatch.setattr(invariance, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        run_studies(out, scale="test", progress=False)
    assert fig.read_bytes() == first
    monkeypatch.undo()
    monkeypatch.setattr(rep, "STUDIES", ("lesson_stats", "invariance"))
    run_studies(out, scale="test", only=["invariance"], progress=False)
    page = (out / "index.html").read_text()
    shown = {m[1]: base64.b64decode(m[2]) for m in re.finditer(r'alt="([^"]+)" src="data:image/png;base64,([^"]+)"',
                                                                page)}
    assert shown["lesson_stats"] == first
    assert not (out / "figures" / rep.STAGING).exists()
    fig.write_bytes(b"\x89PNG not the study's")  # replaced by hand: the page says so instead of showing it
    result = rep._previous(out / "results.json")
    # (a way that works: run again without --overwrite, the study refused to replace a file normlab did not write)
    assert "is not the figure of this run of the study: run the study again with --overwrite" in \
        rep.render_html(result, out / "figures")


def test_an_output_whose_name_fits_is_written_however_long_its_temporary_name_would_be(tmp_path):
    """A 245-character recording's RTTM (250 bytes: a legal name) failed with "File name too long": the
    temporary name beside it added the process id."""
    out = tmp_path / ("b" * 245 + ".rttm")
    written.write_text(out, "SPEAKER x 1 0 1 <NA> <NA> A <NA> <NA>\n")
    assert out.read_text().startswith("SPEAKER")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, written.LIST])  # no temporary left
    written.check([out])  # recorded as normlab's own
    assert len(written.temporary(out, 123456).name) <= written.NAME_MAX
    assert written.temporary(tmp_path / "a.rttm", 7).name == ".a.rttm.7.tmp"  # short names keep theirs


def test_a_report_into_a_folder_it_cannot_make_says_how_out(tmp_path):
    """`--out afile/x` (or a read-only mount) read "afile/x: Not a directory" from the lock, no way out given."""
    pytest.importorskip("matplotlib")
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ValueError, match=r"--out .*afile/x: .*afile is a file, not a folder: give another --out"):
        run_studies(tmp_path / "afile" / "x", scale="test", only=["lesson_stats"], progress=False)
    assert (tmp_path / "afile").read_text() == "mine"


def _full_disk(monkeypatch, free: int, says: str):
    """A disk with ``free`` bytes left, where ``torch.save`` writes half a file and raises ``says`` (as its
    writer does when the disk fills); returns the ``disk_usage`` tuple type, to make room again."""
    import shutil
    from collections import namedtuple

    import torch

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 20, 10 << 20, free))

    def cut_short(obj, f):
        pathlib.Path(f).write_bytes(b"PK half")
        raise RuntimeError(says)

    monkeypatch.setattr(torch, "save", cut_short)
    return usage


def test_a_write_that_fails_on_a_full_disk_is_said_as_a_full_disk(tmp_path, monkeypatch):
    """torch.save on a full disk raised "unexpected pos" (and libsndfile "System error"): a traceback and "a bug
    in normlab", and the half-written checkpoint left behind."""
    import errno
    import shutil

    from normlab.diarization.training import train as train_mod

    usage = _full_disk(monkeypatch, 512, "[enforce fail at inline_container.cc:672] . unexpected pos 52928 vs 52820")
    with pytest.raises(OSError) as e:
        train_mod._save(tmp_path / "last.pt", {"step": 1})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []  # no half-written temporary left
    assert written.full_disk(tmp_path / "x", RuntimeError("System error")).errno == errno.ENOSPC
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 30, 1 << 30, 9 << 30))
    assert written.full_disk(tmp_path / "x", RuntimeError("System error")) is None  # room left: not the disk
    with pytest.raises(RuntimeError, match="unexpected pos"):  # then it stays what it was (a bug's traceback)
        train_mod._save(tmp_path / "last.pt", {"step": 1})


def test_every_whole_file_save_says_a_full_disk(tmp_path, monkeypatch):
    """Saving a model (train's model.pt, whiten, tune --save) or any file written whole on a full disk printed
    torch's "iostream error" with a traceback and "a bug in normlab", and left its temporary behind."""
    import errno

    import torch

    from normlab.diarization.models.eend import EENDModel, ModelConfig

    _full_disk(monkeypatch, 0, "basic_ios::clear: iostream error")
    for save in (lambda p: written.replace_whole(p, lambda tmp: torch.save({}, tmp)),
                 lambda p: EENDModel(ModelConfig(d_model=16, n_layers=1, n_heads=4, d_ff=32)).save(p)):
        with pytest.raises(OSError) as e:
            save(tmp_path / "model.pt")
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "model.pt")
        assert list(tmp_path.iterdir()) == []  # no half-written temporary left


def test_a_file_named_figures_in_the_report_folder_stops_it_before_any_cell(tmp_path):
    """A file where the figures folder goes was found only when the first figure was drawn, after the cells."""
    pytest.importorskip("matplotlib")
    (tmp_path / "figures").write_text("mine")
    with pytest.raises(ValueError, match=r"figures is a file, not a folder"):
        run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    assert not (tmp_path / "runs.sqlite").exists() and (tmp_path / "figures").read_text() == "mine"


def test_a_list_that_cannot_be_replaced_leaves_no_temporary(tmp_path):
    """A folder where the folder's list of written files goes: the error, and the list's temporary left beside."""
    (tmp_path / written.LIST).mkdir()
    with pytest.raises(OSError):
        written.write_text(tmp_path / "a.rttm", "x")
    assert not [f.name for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_an_output_folder_named_by_a_broken_link_says_where_it_points(tmp_path):
    """It read "cannot write there (File exists)"."""
    (tmp_path / "out").symlink_to(tmp_path / "gone" / "out")
    with pytest.raises(ValueError, match=r"--out .*out is a link to .*gone/out, which does not exist"):
        written.writable_folder(tmp_path / "out")


def test_a_report_whose_page_meets_a_full_disk_keeps_its_json_and_page_together(tmp_path, monkeypatch):
    """On a full disk results.json was replaced and index.html kept the run before's verdicts; the error named no
    file, and read as the command's own output ("cannot write its output")."""
    import errno
    import pathlib

    from normlab.studies.report import run_studies

    run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    before = {n: (tmp_path / n).read_bytes() for n in ("results.json", "index.html")}
    real = pathlib.Path.write_text

    def full(self, *a, **k):  # as a write's flush on close says it: no file named
        if self.name.startswith(".index.html"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(OSError) as e:
        run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "index.html")
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("only", [None, ["lesson_stats"]], ids=["whole", "only"])
def test_another_commands_results_json_is_not_taken_for_a_report(tmp_path, only):
    """A training run's results.json (normlab's own) read as "holds a None report" to a run of some studies,
    leaving figures/ and a lock behind; a whole report replaced it without a word."""
    import json

    from normlab._checks import BadValue

    out = tmp_path / "run"
    out.mkdir()
    written.write_text(out / "results.json", json.dumps({"config": {"steps": 4}, "final_loss": 0.5}) + "\n")
    kept = (out / "results.json").read_text()
    with pytest.raises(BadValue, match="results.json is another normlab command's output, not a report: give "
                                       "--out another folder, or --overwrite to replace it"):
        run_studies(out, scale="test", only=only, progress=False)
    assert (out / "results.json").read_text() == kept
    assert sorted(p.name for p in out.iterdir()) == sorted(["results.json", written.LIST])  # no figures/, no lock


def test_a_folder_under_a_file_is_refused_before_any_folder_is_made(tmp_path, monkeypatch):
    """`--out new/../afile/sub` made `new`, then said "cannot write there (File exists)"."""
    from normlab._checks import BadValue

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BadValue, match="afile is a file, not a folder: give another --out"):
        written.writable_folder("new/../afile/sub")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
