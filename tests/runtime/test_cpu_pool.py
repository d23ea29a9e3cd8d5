"""The process's pool of worker threads for the CPU kernels' parallel forms
(tessera.runtime.cpu_pool): results equal the serial kernel's bit for bit whether the
workers are spinning or asleep, while another Python thread holds the pool, and in a
forked child; the pool never has more workers than cores to spare."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from tessera.compiler.cpu.elementwise import E, fused_elementwise
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.runtime import cpu_pool
from tessera.runtime.cpu import load_kernel

SHAPE = (48, 257)
needs_two_cores = pytest.mark.skipif(cpu_pool.usable_cores() < 2,
                                     reason="the pool has no workers on one core")


@pytest.fixture(scope="module")
def kernel():
    return load_kernel(fused_elementwise((E.input(0) * 0.5 + E.input(1)).tanh(),
                                         [TensorSpec(SHAPE, "float32")] * 2))


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))


def _check(kernel, seed: int, threads: int) -> None:
    x, y = _inputs(seed)
    want = kernel(x, y, threads=1)[0]
    assert kernel(x, y, threads=threads)[0].tobytes() == want.tobytes()


@needs_two_cores
def test_workers_start_once_and_never_outnumber_the_spare_cores(kernel):
    for threads in (2, 3, SHAPE[0], SHAPE[0] + 9):
        _check(kernel, threads, threads)
    started = cpu_pool.workers()
    assert 1 <= started <= cpu_pool.usable_cores() - 1
    for threads in (2, SHAPE[0]):
        _check(kernel, threads, threads)
    assert cpu_pool.workers() == started


@needs_two_cores
def test_sleeping_workers_wake_for_the_next_call(kernel):
    _check(kernel, 0, 2)
    state = cpu_pool._POOL.state
    deadline = time.monotonic() + 10
    while state.sleepers < state.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.sleepers == state.started >= 1, "idle workers did not go to sleep"
    _check(kernel, 1, 2)


def test_python_threads_sharing_the_pool_get_the_serial_results(kernel):
    errors: list[BaseException] = []

    def calls(seed: int) -> None:
        try:
            for i in range(40):
                _check(kernel, seed * 100 + i, 2 + i % 5)
        except BaseException as exc:    # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=calls, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a call never returned"
    assert not errors, errors[0]
    assert cpu_pool._POOL.state.busy == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_workers(kernel):
    _check(kernel, 0, 2)             # the parent's workers exist before the fork
    pid = os.fork()
    if pid == 0:                     # the child: any failure or hang is its exit status
        code = 1
        try:
            signal.alarm(60)
            _check(kernel, 1, 2)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
