"""`dtlabs report LAB` on a graded class (conftest.graded_class: `dtlabs grade` and a Slurm-style `grade-one` +
`merge`), opened in headless Chromium.

What they protect: the page shows the score distribution, the failures per test cell, the most common first failing
messages with counts, the NOT GRADED submissions with the reason, and grading seconds per submission, from whichever
grading path filled the course; its plots render (images of non-zero size); it never holds hidden test source, and
with --anonymous no student id.
"""
from __future__ import annotations

import re

import pytest
from helpers.browser import CHROMIUM_ARGS, find_chromium
from helpers.synthetic import CLASS, HIDDEN_SOURCE, SYNTHETIC_LAB as LAB

from lab_utils import cli
from lab_utils.grading.export import report

pytestmark = pytest.mark.xdist_group("graded-class")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_counts_what_the_class_got_wrong(graded_class):
    res = report.gather(graded_class, LAB)
    by = {g.student: g for g in res.graded}
    assert set(by) == {"ann", "bob", "cat", "eve"}, "bob came through grade-one + merge, the rest through grade"
    assert [(s, "invalid notebook" in why) for s, why in res.not_graded] == [("dan", True)], res.not_graded
    assert (by["eve"].score, by["eve"].penalty) == (3.0, 1.0)
    assert by["cat"].first_failure == "test_add: AssertionError: add is wrong for negative or fractional numbers"
    assert by["bob"].first_failure.startswith("test_add: NotImplementedError"), by["bob"].first_failure
    assert by["ann"].first_failure is None
    assert set(res.seconds) == set(CLASS), "every grading run, graded or not, records its seconds"
    assert all(s > 0 for s in res.seconds.values()), res.seconds


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_report_renders_its_plots_in_chromium(graded_class, tmp_path, capsys):
    chromium, why = find_chromium()
    if chromium is None:
        pytest.fail(why)  # .ci/install-browser installs it: a report nobody can look at is not tested
    page_path = tmp_path / "report.html"
    assert cli.main(["report", LAB, "--out", str(page_path), "--course-root", str(graded_class)]) == 0
    assert f"report: {page_path}" in capsys.readouterr().out
    text = page_path.read_text()
    assert HIDDEN_SOURCE not in text and "BEGIN HIDDEN" not in text, "the report must never show hidden test source"

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            sizes = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => [i.id, i.complete, i.naturalWidth, i.naturalHeight, "
                       "i.getBoundingClientRect().width, i.getBoundingClientRect().height])")
            body = page.inner_text("body")
            tests_table = page.inner_text("#tests table")
            firsts = page.eval_on_selector_all("#messages tr", "rows => rows.map(r => "
                                               "[...r.querySelectorAll('td')].map(c => c.innerText))")
        finally:
            browser.close()
    assert {s[0] for s in sizes} == {"plot-scores", "plot-tests", "plot-seconds"}, sizes
    for name, complete, nat_w, nat_h, w, h in sizes:
        assert complete and nat_w > 100 and nat_h > 50 and w > 100 and h > 50, f"{name} did not render: {sizes}"
    assert "4 graded, 1 not graded" in body, body[:500]
    assert re.search(r"Synthetic lab \(test_add\)\s+2\s+yes\s+2\s+4", tests_table), tests_table  # bob and cat
    assert re.search(r"test_twice\s+1\s+no\s+1\s+4", tests_table), tests_table  # bob
    assert sorted(r for r in firsts if r) == [["1", "test_add: AssertionError: add is wrong for negative or fractional "
                                                "numbers"], ["1", "test_add: NotImplementedError: the submission's code raised NotImplementedError (hidden "
                                                    "tests have run: its message is not shown)"]], firsts
    assert "dan" in body and "invalid notebook" in body
    assert "1 submission(s) lost points to the late-submission penalty" in body

    anonymous = tmp_path / "anonymous.html"
    assert cli.main(["report", LAB, "--out", str(anonymous), "--anonymous", "--course-root", str(graded_class)]) == 0
    shared = anonymous.read_text()
    assert not any(re.search(rf"\b{s}\b", shared) for s in CLASS), "--anonymous must name no student"
    assert "submission " in shared and "invalid notebook" in shared
