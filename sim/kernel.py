"""A minimal discrete-event kernel: integer-cycle time, generator processes.

Processes are generators that yield :class:`Event` objects and resume when
they trigger; time jumps from one scheduled event to the next, so idle
stretches cost nothing.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable, Generator, Iterator

ProcessGen = Generator["Event", Any, Any]


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
        for cb in self.callbacks:
            self.kernel.at(self.kernel.now, cb, value)
        self.callbacks.clear()
        return self

    def on(self, cb: Callable[[Any], None]) -> None:
        if self.triggered:
            self.kernel.at(self.kernel.now, cb, self.value)
        else:
            self.callbacks.append(cb)


class Kernel:
    """The event loop: a heap of ``(time, sequence, callback, argument)``."""

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0

    def at(self, time: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        if time < self.now:
            raise RuntimeError(f"scheduling in the past ({time} < {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, fn, arg))

    def timeout(self, delay: int) -> Event:
        ev = Event(self)
        self.at(self.now + int(delay), lambda _: ev.succeed())
        return ev

    def process(self, gen: ProcessGen) -> Event:
        """Start ``gen``; the returned event triggers with its return value."""
        done = Event(self)

        def step(value: Any) -> None:
            try:
                ev = gen.send(value)
            except StopIteration as stop:
                done.succeed(stop.value)
                return
            ev.on(step)

        self.at(self.now, step)
        return done

    def run(self, stop: Event | None = None) -> None:
        """Run until nothing is scheduled (or ``stop`` has triggered)."""
        heap = self._heap
        while heap and not (stop is not None and stop.triggered):
            time, _, fn, arg = heapq.heappop(heap)
            self.now = time
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

    def _notify(self) -> None:
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
            self.kernel.at(self.kernel.now + self.latency, lambda _: self._notify())

    def get(self) -> Any:
        _, item = self.items.popleft()
        now = self.kernel.now
        if self._gets_cycle != now:
            self._gets_cycle, self._gets_now = now, 0
        self._gets_now += 1
        self._notify()
        self.kernel.at(now + 1, lambda _: self._notify())
        return item

    def wait_ready(self) -> Iterator[Event]:
        """Yield until the head entry is visible."""
        while not self.ready():
            yield self.changed()

    def wait_space(self) -> Iterator[Event]:
        while self.full:
            yield self.changed()
