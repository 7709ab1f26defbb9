"""lab_utils.labkit.locks: a lock served by the test's process counts every acquisition and the process that made it."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time

import pytest

from lab_utils.labkit.locks import CountedLock, LockClient


def _take(client, times, hold_s=0.0):
    for _ in range(times):
        with client:
            time.sleep(hold_s)


def test_acquisitions_and_processes_are_counted_by_the_server(tmp_path):
    with CountedLock(str(tmp_path)) as lock:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_take, args=(lock.client(), 5)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        deadline = time.monotonic() + 5
        while lock.acquisitions < 15 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lock.acquisitions == 15
        assert sorted(lock.pids) == sorted(p.pid for p in procs)
        assert os.getpid() not in lock.pids


def test_mutual_exclusion_holds_across_processes(tmp_path):
    with CountedLock(str(tmp_path)) as lock:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_take, args=(lock.client(), 3, 0.01)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        time.sleep(0.1)
        spans = sorted((a, r) for _, a, r in lock.grants)
        assert len(spans) == 6 and all(r is not None for _, r in spans)
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), spans


def test_client_pickles_as_its_address_and_reconnects_after_fork(tmp_path):
    with CountedLock(str(tmp_path)) as lock:
        client = pickle.loads(pickle.dumps(lock.client()))
        assert isinstance(client, LockClient) and client.address == lock.address
        client.acquire()
        client.release()
        assert lock.acquisitions == 1


def test_release_without_acquire_is_refused_and_a_dead_holder_frees_the_lock(tmp_path):
    with CountedLock(str(tmp_path)) as lock:
        with pytest.raises((RuntimeError, OSError)):
            lock.client().release()
        ctx = multiprocessing.get_context("fork")

        def hold_and_die(client):
            client.acquire()
            os._exit(0)

        p = ctx.Process(target=hold_and_die, args=(lock.client(),))
        p.start()
        p.join(30)
        got = threading.Event()
        t = threading.Thread(target=lambda: (_take(lock.client(), 1), got.set()), daemon=True)
        t.start()
        assert got.wait(10), "a process that died holding the lock kept it"
        assert lock.acquisitions == 2


def test_a_long_directory_still_works(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    with CountedLock(str(deep)) as lock:
        _take(lock.client(), 2)
        assert lock.acquisitions == 2


def _increment(client, counter, times, read_under_lock):
    for _ in range(times):
        if read_under_lock:
            with client:
                counter.value = counter.value + 1
        else:  # the locked-baseline mistake: read first, then hold the lock only around the write
            seen = counter.value
            with client:
                counter.value = seen + 1


@pytest.mark.parametrize("read_under_lock", [True, False])
def test_grant_delay_makes_a_read_outside_the_lock_lose_updates(tmp_path, read_under_lock):
    """With a grant delay every worker waits for the lock at once: a read taken before the lock is stale by the time
    the write is granted, so updates are lost; reads under the lock lose none."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("l", 0, lock=False)
    with CountedLock(str(tmp_path), grant_delay=0.003) as lock:
        procs = [ctx.Process(target=_increment, args=(lock.client(), counter, 20, read_under_lock)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0, 0]
    if read_under_lock:
        assert counter.value == 40
    else:
        assert counter.value < 40, "no update was lost although every read was taken outside the lock"


def test_grant_delay_is_checked():
    with pytest.raises(ValueError, match="grant_delay"):
        CountedLock(grant_delay=5)
