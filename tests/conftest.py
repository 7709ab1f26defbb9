"""Fixtures and hooks only; what they are built from lives in ``tests/helpers/``."""
from __future__ import annotations

import gc
import os
import shutil
import tempfile
import uuid

import pytest

from helpers import summary
from helpers.processes import TEST_TOKEN_VAR, assert_no_leftovers
from helpers.schedule import expected_s
from helpers.synthetic import SYNTHETIC_LAB, grade_class, make_synthetic_course
from lab_utils import grading
from lab_utils.processes import share_cores
from lab_utils.status import Status

# The canary's kept verdicts: one folder per test run (pytest-xdist's workers share it), never the developer's own;
# the process that named it removes it at the end (pytest_unconfigure).
_OWN_CACHE = None if "DTLABS_CACHE_DIR" in os.environ else os.path.join(
    tempfile.gettempdir(), f"dtlabs-test-cache-{os.environ.get('PYTEST_XDIST_TESTRUNUID') or uuid.uuid4().hex}")
if _OWN_CACHE:
    os.environ["DTLABS_CACHE_DIR"] = _OWN_CACHE
# Every process a test starts shares the two cores with three other workers' (lab_utils.processes.share_cores).
share_cores(os.environ)
# Grader kernels of every test, in this process or in a `dtlabs` it runs, fork from one warm server (an empty
# update where c.DTLabs.warm_kernels is off or no server can run: the kernels then start cold and say why).
from lab_utils.warm import shared_env  # noqa: E402

os.environ.update(shared_env(dict(os.environ)))


@pytest.fixture(autouse=True)
def sandbox_choice_of_this_test(monkeypatch):
    """The sandbox a command chose (``sandbox.choose``/``require``) lasts for its process; a test starts with none, so
    what it sets (``DTLABS_SANDBOX``, a course's config) is what it gets, whatever ran before it on that worker."""
    from lab_utils.grading.boundary import sandbox

    monkeypatch.setattr(sandbox, "_chosen", None)
    monkeypatch.setattr(sandbox, "_user", None)


@pytest.fixture
def process_token(monkeypatch):
    """A fresh token in this test's environment; every process the test starts inherits it."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TOKEN_VAR, token)
    return token


@pytest.fixture
def no_leaked_processes(process_token):
    """Use in any test that starts ranks, kernels or torchrun: it fails if one of them outlives the test."""
    yield process_token
    assert_no_leftovers(process_token)


@pytest.fixture(scope="session")
def synthetic_course(tmp_path_factory):
    """A released synthetic course (gradebook filled); copy it before grading into it."""
    root = make_synthetic_course(tmp_path_factory.mktemp("synthetic-course"))
    grading.release([SYNTHETIC_LAB], root=root)
    return root


@pytest.fixture(scope="session")
def graded_class(tmp_path_factory):
    """The synthetic course with a late policy, graded by `dtlabs grade` (four students) and `dtlabs grade-one` +
    `dtlabs merge` (bob): what the exports and the report are built from. Read only."""
    return grade_class(tmp_path_factory.mktemp("graded-class"))


def pytest_runtest_logreport(report):
    summary.collect(report)


def pytest_terminal_summary(terminalreporter):
    summary.write(terminalreporter)


def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "numprocesses", None):
        items.sort(key=expected_s, reverse=True)  # stable: equal weights keep their collection order


def pytest_collection_finish(session):
    """What collecting imported (torch, nbgrader, papermill, the test modules) lives as long as this process: frozen,
    the collections during the tests walk only what the tests make (lab_utils.processes.collector_off_while_importing)."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
