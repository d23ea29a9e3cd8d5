"""A minimal discrete-event kernel: integer-cycle time, generator processes.

Processes are generators that yield :class:`Event` objects and resume when
they trigger, or yield a number of cycles to sleep; time jumps from one scheduled event to the next, so
idle stretches cost nothing.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable, Generator

ProcessGen = Generator["Event | int", Any, Any]
_heappush = heapq.heappush


class Event:
    """Something a process can wait for; triggers once with a value."""

    __slots__ = ("kernel", "callbacks", "triggered", "value")

    def __init__(self, kernel: "Kernel") -> None:
        self.kernel = kernel
        self.callbacks: list[Callable[[Any], None]] = []
        self.triggered = False
        self.value: Any = None

    def succeed(self, value: Any = None) -> "Event":
        if self.triggered:
            raise RuntimeError("event triggered twice")
        self.triggered = True
        self.value = value
        if self.callbacks:
            current = self.kernel._current      # Kernel.at for this cycle, inlined
            for cb in self.callbacks:
                current.append((cb, value))
            self.callbacks.clear()
        return self

    def on(self, cb: Callable[[Any], None]) -> None:
        if self.triggered:
            self.kernel._current.append((cb, self.value))
        else:
            self.callbacks.append(cb)


class Kernel:
    """The event loop: callbacks run in the order of ``(time, order of scheduling)``.

    Callbacks for a later cycle wait in a heap of ``(time, sequence, callback,
    argument)``. One scheduled for the current cycle (a triggered event's waiters, most
    of them) goes to a FIFO instead: it comes after every heap entry for this cycle,
    which were all scheduled in earlier cycles, and after the FIFO's earlier entries,
    the same order the heap would give, without its cost.
    """

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._current: deque[tuple[Callable[[Any], None], Any]] = deque()

    def at(self, time: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        if time == self.now:
            self._current.append((fn, arg))
            return
        if time < self.now:
            raise RuntimeError(f"scheduling in the past ({time} < {self.now})")
        self._seq = seq = self._seq + 1
        _heappush(self._heap, (time, seq, fn, arg))

    def process(self, gen: ProcessGen) -> None:
        """Start ``gen`` (in this cycle, after what is already scheduled for it)."""
        def step(value: Any) -> None:
            try:
                ev = gen.send(value)
            except StopIteration:
                return
            if ev.__class__ is not Event:
                # A sleep of ``ev`` cycles: resumed the way an event's waiter is, queued
                # behind the callbacks already due when the time comes.
                self.at(self.now + int(ev), self._current.append, (step, None))
            else:
                ev.on(step)

        self._current.append((step, None))

    def run(self, stop: Event | None = None) -> None:
        """Run until nothing is scheduled (or ``stop`` has triggered)."""
        heap, pop, current = self._heap, heapq.heappop, self._current
        if stop is None:
            stop = Event(self)          # never triggers
        while not stop.triggered:
            if heap and heap[0][0] == self.now:
                fn, arg = pop(heap)[2:]
            elif current:
                fn, arg = current.popleft()
            elif heap:
                time, _, fn, arg = pop(heap)
                self.now = time
            else:
                return
            fn(arg)


class _Waitable:
    """Shared wake-up logic: waiters retry when the object changes."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._waiters: list[Event] = []

    def changed(self) -> Event:
        ev = Event(self.kernel)
        self._waiters.append(ev)
        return ev

    def _notify(self, _: Any = None) -> None:
        """Wake every waiter (also a kernel callback: its argument is ignored)."""
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, []
        for ev in waiters:
            ev.succeed()


class BoundedQueue(_Waitable):
    """A FIFO of ``capacity`` entries; each entry becomes visible ``latency`` cycles after its put.

    As in a hardware FIFO whose fill level is a register, a slot freed by a
    get in cycle ``t`` can take a new entry from cycle ``t + 1``.
    """

    def __init__(self, kernel: Kernel, name: str, capacity: int, latency: int = 0) -> None:
        super().__init__(kernel)
        self.name = name
        self.capacity = capacity
        self.latency = latency
        self.items: deque[tuple[int, Any]] = deque()
        self._gets_cycle = -1
        self._gets_now = 0          # gets in cycle _gets_cycle, whose slots are not free yet

    def __len__(self) -> int:
        return len(self.items)

    @property
    def full(self) -> bool:
        freeing = self._gets_now if self._gets_cycle == self.kernel.now else 0
        return len(self.items) + freeing >= self.capacity

    def ready(self) -> bool:
        return bool(self.items) and self.items[0][0] <= self.kernel.now

    def put(self, item: Any) -> None:
        assert not self.full
        self.items.append((self.kernel.now + self.latency, item))
        self._notify()
        if self.latency:
            self.kernel.at(self.kernel.now + self.latency, self._notify)

    def get(self) -> Any:
        _, item = self.items.popleft()
        now = self.kernel.now
        if self._gets_cycle != now:
            self._gets_cycle, self._gets_now = now, 0
        self._gets_now += 1
        self._notify()
        self.kernel.at(now + 1, self._notify)
        return item

