"""A faithful fake of the NVML native library, below the ``nvidia-ml-py`` binding.

Tests and the simulator run the real ``pynvml`` code against it::

    fake = load_scenario("h100_8x_healthy")
    with installed(fake):
        fake.gpu(2).set(temperature=88, clocks_mhz={"sm": 990})
        fake.gpu(2).throttle("hw_thermal")
        fake.inject_xid(5, 48)
        fake.lose(3)
"""

from __future__ import annotations

from fleetscope.sources.nvml_h import NvmlReturn
from fleetscope_sim.nvml_fake.latency import Booked, LatencyModel
from fleetscope_sim.nvml_fake.library import FakeGpu, FakeNvml, install, installed, private_binding, uninstall
from fleetscope_sim.nvml_fake.scenarios import SCENARIO_DIR, load_scenario, scenario_names, write_sysfs

__all__ = [
    "SCENARIO_DIR",
    "Booked",
    "FakeGpu",
    "FakeNvml",
    "LatencyModel",
    "NvmlReturn",
    "install",
    "installed",
    "load_scenario",
    "private_binding",
    "scenario_names",
    "uninstall",
    "write_sysfs",
]
