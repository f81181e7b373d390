"""Criteria are written once: the value a study compares with and the text it prints come from one object,
and that text is the one docs/studies.md publishes. Seed-level uncertainty helpers. Lesson criteria can fail."""
from __future__ import annotations

import pathlib
import re

from normlab.lab import lesson
from normlab.studies.base import Criterion, bootstrap, interval, spread
from normlab.studies.criteria import CRITERIA, branch_ratio_prediction

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "studies.md"


def _docs_criteria() -> dict[str, str]:
    """``| id | criterion |`` rows of docs/studies.md (``\\|`` is a literal bar inside a cell)."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) >= 2 and cells[0] in CRITERIA:
            rows.setdefault(cells[0], cells[1])
    return rows


def test_every_criterion_is_published_verbatim_in_the_docs():
    docs = _docs_criteria()
    assert set(docs) == set(CRITERIA), set(CRITERIA) ^ set(docs)
    for cid, crit in CRITERIA.items():
        assert docs[cid] == crit.text, (cid, docs[cid], crit.text)


def test_every_claim_is_stated_with_its_source_in_the_docs():
    """docs/studies.md's claims table: one row per claim id, naming the study that checks it and a source."""
    from normlab.studies import STUDIES

    text = DOCS.read_text()
    section = text[text.index("\n## The claims\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0] in CRITERIA:
            rows[cells[0]] = cells
    assert set(rows) == set(CRITERIA), set(CRITERIA) ^ set(rows)
    for cid, (_, study, statement, source) in rows.items():
        assert study.strip("`") in STUDIES and statement and source, cid


def test_criterion_text_and_value_are_one_object():
    c = Criterion("Pre g{top}/g6 <= {pre_max}", top=24, pre_max=0.75)
    assert c.text == "Pre g24/g6 <= 0.75" and c["pre_max"] == 0.75
    moved = c.at(pre_max=1.0)
    assert moved.text == "Pre g24/g6 <= 1" and moved["pre_max"] == 1.0 and c["pre_max"] == 0.75
    assert Criterion("x < {tol}", tol=1e-5).text == "x < 1e-5"


def test_the_papers_limits_are_the_published_ones():
    """The numbers the claims rest on (docs/studies.md explains each); a moved limit must be a visible change."""
    assert (CRITERIA["3"]["pre_max"], CRITERIA["3"]["post_min"], CRITERIA["3"]["post_max"]) == (0.75, 0.8, 1.25)
    assert CRITERIA["9"]["post_fail"] == CRITERIA["6"]["post_fail"]  # the counterfactual is claim 6's failure
    assert CRITERIA["4"]["seeds"] >= 20 and CRITERIA["4"]["batches"] >= 16
    assert CRITERIA["2"]["post_pred"] == 1.5  # Lemma 2: E||x^(post,5)||^2 = 3d/2
    assert abs(branch_ratio_prediction(64, 128) - 0.3077) < 1e-4 and CRITERIA["10"]["post_pred"] == 0.308
    assert abs(branch_ratio_prediction(64, 64) - 1 / 3) < 1e-12  # d_ff = d: Var[F] = 1/2, ratio 1/3
    for cid in ("7a", "7b"):
        assert (CRITERIA[cid]["post_min"], CRITERIA[cid]["sub_max"], CRITERIA[cid]["deep_min"]) == (10, 8, 10)


def test_bootstrap_interval_brackets_the_estimate_and_narrows_with_seeds():
    few = [1.0, 2.0, 3.0, 4.0]
    lo, hi = bootstrap(few, lambda v: sum(v) / len(v))
    assert lo < 2.5 < hi
    many = few * 25
    lo2, hi2 = bootstrap(many, lambda v: sum(v) / len(v))
    assert lo2 < 2.5 < hi2 and hi2 - lo2 < (hi - lo) / 2
    pairs = [(1.0, 2.0), (1.0, 2.2), (1.0, 1.8)]  # a ratio of means resampled jointly per seed
    assert interval("r", pairs, lambda p: sum(b for _, b in p) / sum(a for a, _ in p)).startswith("r 2 [")
    assert spread("loss", [0.5, 0.1, 3.0]) == "loss 0.1 to 3 (3 seeds)"


def test_every_counted_lesson_criterion_can_fail():
    """NaN input fails the finiteness criterion (a criterion that is always True would not be counted)."""
    r = lesson.run_lesson(lesson.LessonConfig(shift=float("nan")))
    failed = {c["name"] for c in r["criteria"] if not c["pass"]}
    assert "outputs are finite" in failed and not r["passed"]
    names = [c["name"] for c in lesson.run_lesson()["criteria"]]
    assert "runs" not in names
