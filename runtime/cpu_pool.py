"""The process's pool of worker threads for the kernels' parallel forms.

A kernel's parallel form (``tessera.parallel``, :func:`.cpu_abi.parallel_ir`) splits
its loop into slices; with the pool, slice 0 and any slice beyond the pool's workers
run on the calling thread, slice k on worker k. Starting a thread per call instead
costs ~50 us here, plus waking an idle vCPU, which is more than a float32 add of 1e6
elements gains from a second core (150 us alone, 67 us on two warm threads).

The pool is made of IR emitted into every module with a parallel form (the same code
in each: :func:`pool_ir`), around one state that Python owns (:class:`PoolState`,
allocated once per process; :func:`attach` writes its address into each loaded module's
``tessera.pool`` global). The first module attached is the pool's *owner*: the workers
run its ``tessera.pool.worker``, and it is kept for the life of the process.

* A call publishes its slices in one word, ``generation``: a count of calls times 256
  plus the number of workers taking part (1..w take slices 1..w), so a worker late to
  one call cannot mistake the next call's slices for its own; the call waits for those
  w (``remaining``). Idle workers poll the word for :data:`SPIN` polls (a yield every
  64), then sleep on a condition variable.
* One call at a time: another Python thread calling a parallel kernel meanwhile runs
  its slices on its own thread (``busy``), with the same results.
* After ``fork`` the child has none of the parent's threads: the state is reset in
  the child (``os.register_at_fork``) and workers start again when needed.
* Workers are started when a call first wants them, one fewer than the cores this
  process may run on at most (a call on more threads runs the extra slices itself:
  more threads than cores would only take turns), and never stop (detached; they sleep
  when idle).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import TYPE_CHECKING

from tessera.errors import CpuKernelError

if TYPE_CHECKING:     # jit imports cpu_abi, which imports this module
    from tessera.runtime.jit import JitModule

POOL = "tessera.pool"
POOL_RUN = "tessera.pool.run"
POOL_WORKER = "tessera.pool.worker"
#: Polls of ``generation`` by an idle worker before it sleeps: 0.3-0.7 ms here, so a
#: model's next kernel finds the workers awake; a sleeping one takes tens of
#: microseconds to wake on this VM.
SPIN = 1 << 16
#: The count of workers in ``generation`` takes its low 8 bits: at most 255 workers.
_WORKER_SLOTS = 256
#: A slice's context in :func:`.cpu_abi.parallel_ir`: the argument pointers, begin, end.
CTX = "{ ptr, i64, i64 }"

#: The state's fields: (name, LLVM type, ctypes type). One list for both sides.
_FIELDS = (("generation", "i64", ctypes.c_int64), ("remaining", "i64", ctypes.c_int64),
           ("sleepers", "i64", ctypes.c_int64), ("busy", "i64", ctypes.c_int64),
           ("started", "i64", ctypes.c_int64), ("spawn_generation", "i64", ctypes.c_int64),
           ("fn", "ptr", ctypes.c_void_p), ("ctxs", "ptr", ctypes.c_void_p),
           ("worker", "ptr", ctypes.c_void_p),
           ("capacity", "i64", ctypes.c_int64),
           # Room for glibc's pthread_mutex_t (24-48 bytes) and pthread_cond_t (48).
           ("mutex", "[8 x i64]", ctypes.c_int64 * 8),
           ("cond", "[8 x i64]", ctypes.c_int64 * 8))
_INDEX = {name: i for i, (name, _, _) in enumerate(_FIELDS)}
STATE = "{ " + ", ".join(ty for _, ty, _ in _FIELDS) + " }"


class PoolState(ctypes.Structure):
    """The pool's state as this process lays it out (C rules, as LLVM lays out
    :data:`STATE`)."""
    _fields_ = [(name, cty) for name, _, cty in _FIELDS]


def _fields_ir(state: str) -> list[str]:
    """``%<name>.p = getelementptr`` for every field of the state at ``%<state>``."""
    return [f"  %{name}.p = getelementptr inbounds {STATE}, ptr %{state}, i64 0, i32 {i}"
            for name, i in _INDEX.items()]


def _yield_every_64(counter: str, label: str, then: str) -> list[str]:
    """Blocks ``<label>`` and ``<label>.yield``: ``sched_yield()`` when ``counter`` is a
    multiple of 64, then on to ``then``."""
    return [f"{label}:",
            f"  %{label}.low = and i64 %{counter}, 63",
            f"  %{label}.now = icmp eq i64 %{label}.low, 0",
            f"  br i1 %{label}.now, label %{label}.yield, label %{then}",
            f"{label}.yield:",
            f"  %{label}.r = call i32 @sched_yield()",
            f"  br label %{then}"]


def pool_ir(pthread_t: str) -> str:
    """IR of the pool (see the module docstring) for a host whose ``pthread_t`` is the
    LLVM type ``pthread_t``:
    the ``tessera.pool`` global, ``i1 tessera.pool.run(state, slice fn, ctxs, n)``
    (false if another call holds the pool: then nothing ran) and the worker body."""
    return "\n".join([
        f'@"{POOL}" = global ptr null',
        "declare i32 @pthread_create(ptr, ptr, ptr, ptr)",
        f"declare i32 @pthread_detach({pthread_t})",
        "declare i32 @pthread_mutex_lock(ptr)",
        "declare i32 @pthread_mutex_unlock(ptr)",
        "declare i32 @pthread_cond_wait(ptr, ptr)",
        "declare i32 @pthread_cond_broadcast(ptr)",
        "declare i32 @sched_yield()",
        *_run_ir(pthread_t), *_worker_ir(), ""])


def _run_ir(pthread_t: str) -> list[str]:
    """``tessera.pool.run``: take the pool, start the workers the call wants, publish
    the slices, run the caller's own, wait for the workers' and free the pool."""
    return [
        f'define internal i1 @"{POOL_RUN}"(ptr %s, ptr %fn, ptr %ctxs, i64 %n) {{',
        "entry:",
        *_fields_ir("s"),
        "  %cx = cmpxchg ptr %busy.p, i64 0, i64 1 seq_cst seq_cst",
        "  %got = extractvalue { i64, i1 } %cx, 1",
        "  br i1 %got, label %spawn.head, label %refuse",
        "refuse:",
        "  ret i1 false",
        "spawn.head:",
        "  %want.all = sub i64 %n, 1",
        "  %cap = load i64, ptr %capacity.p, align 8",
        "  %want.fits = icmp ult i64 %want.all, %cap",
        "  %want = select i1 %want.fits, i64 %want.all, i64 %cap",
        "  %g0 = load atomic i64, ptr %generation.p seq_cst, align 8",
        "  store atomic i64 %g0, ptr %spawn_generation.p seq_cst, align 8",
        "  %st0 = load atomic i64, ptr %started.p seq_cst, align 8",
        f"  %tid = alloca {pthread_t}",
        "  br label %spawn",
        *_spawn_workers_ir(pthread_t),
        "publish:",
        "  %have = phi i64 [ %st, %spawn ], [ %st, %spawn.make ]",
        "  %have.few = icmp ult i64 %have, %want",
        "  %w = select i1 %have.few, i64 %have, i64 %want",
        "  store ptr %fn, ptr %fn.p",
        "  store ptr %ctxs, ptr %ctxs.p",
        "  store atomic i64 %w, ptr %remaining.p seq_cst, align 8",
        # Only the caller holding ``busy`` writes the word: no read-modify-write.
        f"  %g.calls = and i64 %g0, {-_WORKER_SLOTS}",
        f"  %g.next = add i64 %g.calls, {_WORKER_SLOTS}",
        "  %g1 = or i64 %g.next, %w",
        "  store atomic i64 %g1, ptr %generation.p seq_cst, align 8",
        "  %sl = load atomic i64, ptr %sleepers.p seq_cst, align 8",
        "  %asleep = icmp ne i64 %sl, 0",
        "  br i1 %asleep, label %wake, label %own",
        "wake:",
        "  %wl = call i32 @pthread_mutex_lock(ptr %mutex.p)",
        "  %wb = call i32 @pthread_cond_broadcast(ptr %cond.p)",
        "  %wu = call i32 @pthread_mutex_unlock(ptr %mutex.p)",
        "  br label %own",
        *_own_slices_ir(),
        *_join_workers_ir(),
        "}", ""]


def _spawn_workers_ir(pthread_t: str) -> list[str]:
    """Blocks ``spawn...`` of ``tessera.pool.run``: start workers until there are
    ``%want`` (or one cannot be made), then on to ``publish``."""
    return [
        "spawn:",
        "  %st = phi i64 [ %st0, %spawn.head ], [ %st1, %spawn.made ]",
        "  %need = icmp ult i64 %st, %want",
        "  br i1 %need, label %spawn.make, label %publish",
        "spawn.make:",
        "  %st1 = add nuw i64 %st, 1",
        "  %karg = inttoptr i64 %st1 to ptr",
        "  %worker = load ptr, ptr %worker.p",
        "  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr %worker, ptr %karg)",
        "  %ok = icmp eq i32 %rc, 0",
        "  br i1 %ok, label %spawn.made, label %publish",
        "spawn.made:",
        f"  %t = load {pthread_t}, ptr %tid",
        f"  %dt = call i32 @pthread_detach({pthread_t} %t)",
        "  store atomic i64 %st1, ptr %started.p seq_cst, align 8",
        "  br label %spawn"]


def _own_slices_ir() -> list[str]:
    """Blocks ``own...``: the caller runs slice 0, then slices ``%w + 1 .. %n - 1``
    (those beyond the workers)."""
    return [
        "own:",
        "  %r0 = call ptr %fn(ptr %ctxs)",
        "  %first = add nuw i64 %w, 1",
        "  br label %own.loop",
        "own.loop:",
        "  %j = phi i64 [ %first, %own ], [ %j1, %own.body ]",
        "  %more = icmp ult i64 %j, %n",
        "  br i1 %more, label %own.body, label %join",
        "own.body:",
        f"  %c = getelementptr inbounds {CTX}, ptr %ctxs, i64 %j",
        "  %rj = call ptr %fn(ptr %c)",
        "  %j1 = add nuw i64 %j, 1",
        "  br label %own.loop"]


def _join_workers_ir() -> list[str]:
    """Blocks ``join...``: wait until every worker has acknowledged the generation,
    then free the pool."""
    return [
        "join:",
        "  %i = phi i64 [ 0, %own.loop ], [ %i1, %join.poll ], [ %i1, %join.poll.yield ]",
        "  %left = load atomic i64, ptr %remaining.p seq_cst, align 8",
        "  %fin = icmp eq i64 %left, 0",
        "  br i1 %fin, label %release, label %join.next",
        "join.next:",
        "  %i1 = add nuw i64 %i, 1",
        "  br label %join.poll",
        *_yield_every_64("i1", "join.poll", "join"),
        "release:",
        "  store atomic i64 0, ptr %busy.p seq_cst, align 8",
        "  ret i1 true"]


def _worker_ir() -> list[str]:
    """``ptr tessera.pool.worker(ptr k)``: worker ``k`` (1-based) forever waits for a
    new generation and, if the call takes it, runs slice ``k`` and acknowledges."""
    return [
        f'define ptr @"{POOL_WORKER}"(ptr %karg) {{',
        "entry:",
        "  %k = ptrtoint ptr %karg to i64",
        f'  %s = load ptr, ptr @"{POOL}"',
        *_fields_ir("s"),
        "  %seen0 = load atomic i64, ptr %spawn_generation.p seq_cst, align 8",
        "  br label %wait",
        "wait:",
        "  %seen = phi i64 [ %seen0, %entry ], [ %g, %done ], [ %g, %work ]",
        "  br label %spin",
        "spin:",
        "  %i = phi i64 [ 0, %wait ], [ %i1, %spin.poll ], [ %i1, %spin.poll.yield ]",
        "  %gs = load atomic i64, ptr %generation.p seq_cst, align 8",
        "  %news = icmp ne i64 %gs, %seen",
        "  br i1 %news, label %work, label %spin.next",
        "spin.next:",
        "  %i1 = add nuw i64 %i, 1",
        f"  %tired = icmp uge i64 %i1, {SPIN}",
        "  br i1 %tired, label %sleep, label %spin.poll",
        *_yield_every_64("i1", "spin.poll", "spin"),
        *_sleep_ir(),
        "work:",
        "  %g = phi i64 [ %gs, %spin ], [ %gw, %wake ]",
        f"  %taking = and i64 %g, {_WORKER_SLOTS - 1}",
        "  %mine = icmp ule i64 %k, %taking",
        "  br i1 %mine, label %run, label %wait",
        "run:",
        "  %fn = load ptr, ptr %fn.p",
        "  %ctxs = load ptr, ptr %ctxs.p",
        f"  %ctx = getelementptr inbounds {CTX}, ptr %ctxs, i64 %k",
        "  %r = call ptr %fn(ptr %ctx)",
        "  br label %done",
        "done:",
        "  %ack = atomicrmw sub ptr %remaining.p, i64 1 seq_cst",
        "  br label %wait",
        "}"]


def _sleep_ir() -> list[str]:
    """Blocks ``sleep...`` and ``wake`` of the worker: count itself a sleeper, wait on
    the condition until the generation moves (checked under the mutex, so a call that
    bumps it after the check sees the sleeper and broadcasts), on to ``work``."""
    return [
        "sleep:",
        "  %l = call i32 @pthread_mutex_lock(ptr %mutex.p)",
        "  %in = atomicrmw add ptr %sleepers.p, i64 1 seq_cst",
        "  br label %sleep.check",
        "sleep.check:",
        "  %gw = load atomic i64, ptr %generation.p seq_cst, align 8",
        "  %neww = icmp ne i64 %gw, %seen",
        "  br i1 %neww, label %wake, label %sleep.wait",
        "sleep.wait:",
        "  %cw = call i32 @pthread_cond_wait(ptr %cond.p, ptr %mutex.p)",
        "  br label %sleep.check",
        "wake:",
        "  %out = atomicrmw sub ptr %sleepers.p, i64 1 seq_cst",
        "  %u = call i32 @pthread_mutex_unlock(ptr %mutex.p)",
        "  br label %work"]


class _Pool:
    """This process's pool state and its owner module."""

    def __init__(self) -> None:
        self.state = PoolState()
        self.owner: JitModule | None = None
        self.lock = threading.Lock()

    def reset(self) -> None:
        """No workers, nothing running; a fresh mutex and condition."""
        libc = ctypes.CDLL(None)
        ctypes.memset(ctypes.addressof(self.state), 0, ctypes.sizeof(self.state))
        self.state.worker = self.owner.address(POOL_WORKER)
        self.state.capacity = min(usable_cores(), _WORKER_SLOTS) - 1
        if libc.pthread_mutex_init(ctypes.byref(self.state.mutex), None) or \
                libc.pthread_cond_init(ctypes.byref(self.state.cond), None):
            raise CpuKernelError("cannot initialise the CPU kernels' thread pool")

    def attach(self, module: JitModule) -> None:
        """Point ``module``'s parallel form at the pool (making ``module`` its owner if
        it is the first)."""
        try:
            slot = module.global_address(POOL)
        except CpuKernelError:     # an object compiled before the pool: own threads
            return
        with self.lock:
            if self.owner is None:
                self.owner = module
                self.reset()
                os.register_at_fork(after_in_child=self.reset)
        ctypes.c_void_p.from_address(slot).value = ctypes.addressof(self.state)


_POOL = _Pool()


def attach(module: JitModule) -> None:
    """Have ``module``'s parallel form (built by :func:`.cpu_abi.module_ir`) run on the
    process's pool."""
    _POOL.attach(module)


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers() -> int:
    """Worker threads the pool has started (0 before a parallel call needed one)."""
    return _POOL.state.started
