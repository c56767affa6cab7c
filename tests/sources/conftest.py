"""The NVML source over the fake, on a clock the test moves: shared by the cadence and fabric tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fleetscope.sources.nvml import NvmlReading, NvmlSource
from fleetscope_sim.nvml_fake import FakeNvml, install, load_scenario, uninstall


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node() -> Iterator[Callable[..., tuple[FakeNvml, NvmlSource, Clock]]]:
    made: list[tuple[FakeNvml, NvmlSource]] = []

    def make(name: str = "h100_8x_healthy", **options: object) -> tuple[FakeNvml, NvmlSource, Clock]:
        fake = load_scenario(name)
        install(fake)
        clock = Clock()
        source = NvmlSource(clock=clock, **options)  # type: ignore[arg-type]
        made.append((fake, source))
        return fake, source, clock

    yield make
    for fake, source in made:
        fake.release()
        source.close()
    uninstall()


def collect(source: NvmlSource, clock: Clock, cycles: int, step: float = 10.0) -> NvmlReading:
    reading = None
    for _ in range(cycles):
        clock.now += step
        reading = source.read()
    assert reading is not None
    return reading
