"""The optional dcgm-exporter compatibility group: common ``DCGM_FI_*`` names in DCGM's units and labels.

Recorded from fleetscope's base-unit metrics (docs/dcgm.md is the mapping), so a dashboard, KEDA rule or
cost tool built for dcgm-exporter keeps working on fleetscope. The names are DCGM's, not the
``level:metric:operations`` form of the production rules, so the group is its own file
(``alerts/fleetscope.dcgm.rules.yml``), deployed only when asked for (the chart's ``dcgmCompat.enabled``,
the kustomize component ``components/dcgm-compat``).
"""

from __future__ import annotations

from fleetscope.metrics import gpu
from fleetscope.rules.model import Group, Record, new_or_increased, sel
from fleetscope.rules.settings import Settings
from fleetscope.sources.xid import XID_CATALOG

MIB = 1048576
# dcgm-exporter's identity labels (Hostname until its #655, hostname since: both), joined from
# fleetscope_gpu_info on (instance, gpu).
DCGM_LABELS = "UUID, device, modelName, pci_bus_id, Hostname, hostname"


def identity(settings: Settings) -> str:
    """``fleetscope_gpu_info`` with dcgm-exporter's label names.

    ``device`` is ``nvidia<gpu>``: NVML's index, which is the device minor number on the usual boards (both
    follow PCI order) but not guaranteed to be. ``Hostname`` (and ``hostname``) is ``instance`` without its port.
    """
    info = sel(settings, gpu.INFO)
    return (
        "label_replace(label_replace(label_replace(label_replace(label_replace(\n"
        f"  {info},\n"
        '  "UUID", "$1", "uuid", "(.*)"),\n'
        '  "modelName", "$1", "name", "(.*)"),\n'
        '  "device", "nvidia$1", "gpu", "(.*)"),\n'
        '  "Hostname", "$1", "instance", "(.*?)(?::[0-9]+)?"),\n'
        '  "hostname", "$1", "Hostname", "(.*)")'
    )


def labelled(settings: Settings, value: str) -> str:
    return f"(\n{value}\n)\n* on (instance, gpu) group_left ({DCGM_LABELS})\n{identity(settings)}"


def xid_codes() -> str:
    """A constant vector: one series per catalog code, labelled ``xid`` with the code as its value."""
    return "\n  or ".join(f'label_replace(vector({code}), "xid", "{code}", "", "")' for code in sorted(XID_CATALOG))


def last_xid(settings: Settings) -> str:
    """The code of the Xid that grew within ``xid_window`` (the highest if several did), else 0.

    PromQL cannot turn a label into a value, so the catalog's codes are a constant vector joined on ``xid``;
    codes outside the catalog (``xid="unknown"``) are not recorded.
    """
    counter = sel(settings, gpu.XID_ERRORS_TOTAL)
    grew = new_or_increased(settings, counter, settings.xid_window)
    return (
        "max without (xid, action) (\n"
        f"  0 * (\n{grew}\n  )\n"
        f"  + on (xid) group_left ()\n  (\n  {xid_codes()}\n  )\n"
        ")\n"
        f"or on (instance, gpu)\n0 * {sel(settings, gpu.MEMORY_USED_BYTES)}"
    )


def recording_rules(settings: Settings) -> Group:
    window = settings.rate_window
    sm_clock = sel(settings, gpu.CLOCK_HERTZ, 'clock="sm"')
    pcie_rate = sel(settings, gpu.PCIE_THROUGHPUT_BYTES_PER_SECOND, 'direction="tx"')
    pcie_bytes = sel(settings, gpu.PCIE_BYTES_TOTAL, 'direction="tx"')
    nvlink_bytes = sel(settings, gpu.NVLINK_BYTES_TOTAL, 'direction="tx"')
    records = {
        "DCGM_FI_DEV_GPU_UTIL": f"100 * {sel(settings, gpu.UTILIZATION_RATIO)}",
        "DCGM_FI_DEV_FB_USED": f"{sel(settings, gpu.MEMORY_USED_BYTES)} / {MIB}",
        "DCGM_FI_DEV_FB_FREE": f"{sel(settings, gpu.MEMORY_FREE_BYTES)} / {MIB}",
        "DCGM_FI_DEV_GPU_TEMP": sel(settings, gpu.TEMPERATURE_CELSIUS),
        "DCGM_FI_DEV_POWER_USAGE": sel(settings, gpu.POWER_WATTS),
        "DCGM_FI_DEV_SM_CLOCK": f"max without (clock) ({sm_clock}) / 1e6",
        "DCGM_FI_DEV_XID_ERRORS": last_xid(settings),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": sel(settings, gpu.UTILIZATION_RATIO),
        "DCGM_FI_PROF_SM_ACTIVE": sel(settings, gpu.SM_ACTIVE_RATIO),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": sel(settings, gpu.TENSOR_ACTIVE_RATIO),
        "DCGM_FI_PROF_DRAM_ACTIVE": sel(settings, gpu.DRAM_ACTIVE_RATIO),
        "DCGM_FI_PROF_PCIE_TX_BYTES": (
            f"max without (direction) ({pcie_rate})\n"
            "or\n"
            f"max without (direction) (rate({pcie_bytes}[{window}]))"
        ),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": (
            f"sum without (link, direction) (rate({nvlink_bytes}[{window}]))"
        ),
    }
    rules = tuple(Record(name, labelled(settings, expr)) for name, expr in records.items())
    return Group("fleetscope-dcgm-compat", rules)


def groups(settings: Settings) -> list[Group]:
    return [recording_rules(settings)]
