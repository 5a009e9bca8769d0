"""Allocator event recorder in torch's trace vocabulary.

The actions are the ones ``torch.cuda.memory._snapshot()["device_traces"]`` uses: ``alloc``,
``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
``segment_unmap``, ``snapshot``, ``oom``. kvlab adds a *phase* label to each event (``"weights"``,
``"measure"``, ...) so a timeline can be coloured by what the program was doing, and the allocated /
reserved totals right after the event so a timeline needs no replay.

The default clock is a logical one (one microsecond per event) so notebooks give the same numbers
on every Restart & Run All; ``CudaDevice`` passes a wall clock.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)


@dataclass(frozen=True)
class TraceEvent:
    time_us: int
    action: str
    addr: int
    size: int  # bytes; for alloc/free the *requested* size, as torch records it
    stream: int
    phase: str
    allocated_bytes: int  # allocator totals right after the event
    reserved_bytes: int
    device: int = 0


class EventRecorder:
    """Collects :class:`TraceEvent` rows; ``to_frame()`` gives a pandas DataFrame."""

    COLUMNS = tuple(TraceEvent.__dataclass_fields__)

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._ticks = itertools.count(1)
        self._clock = clock or (lambda: next(self._ticks))
        self.events: list[TraceEvent] = []
        self.current_phase = "start"

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Label every event inside the block; restores the previous label afterwards."""
        previous, self.current_phase = self.current_phase, label
        try:
            yield
        finally:
            self.current_phase = previous

    def record(
        self,
        action: str,
        addr: int,
        size: int,
        *,
        stream: int = 0,
        allocated_bytes: int,
        reserved_bytes: int,
        device: int = 0,
    ) -> TraceEvent:
        if action not in ACTIONS:
            raise ValueError(f"unknown trace action {action!r}; expected one of {ACTIONS}")
        event = TraceEvent(
            time_us=int(self._clock()),
            action=action,
            addr=addr,
            size=size,
            stream=stream,
            phase=self.current_phase,
            allocated_bytes=allocated_bytes,
            reserved_bytes=reserved_bytes,
            device=device,
        )
        self.events.append(event)
        return event

    def mark(self, label: str, *, allocated_bytes: int, reserved_bytes: int, device: int = 0) -> None:
        """A ``snapshot`` row: a point on the timeline with no allocation (phase boundaries)."""
        with self.phase(label):
            self.record(
                "snapshot", 0, 0, allocated_bytes=allocated_bytes, reserved_bytes=reserved_bytes, device=device
            )

    def clear(self) -> None:
        self.events.clear()

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([asdict(e) for e in self.events], columns=list(self.COLUMNS))
