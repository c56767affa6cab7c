"""The GPU collector through the real daemon, the real pynvml and the fake NVML library (the issue's "Done when")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.check.run import EXIT_HEALTHY, EXIT_UNHEALTHY, run_check
from fleetscope.collectors.gpu import GpuCollector
from fleetscope.config import Config, load
from fleetscope.errors import NoHardware
from fleetscope.serve.daemon import Daemon, build_daemon
from fleetscope_sim.harness import eventually
from fleetscope_sim.nvml_fake import FakeNvml, install, load_scenario, uninstall, write_sysfs
from tests.conftest import FIXTURES, require_binary

VARIANTS = os.path.join(FIXTURES, "kmsg", "variants.kmsg")
BOOT = 1_700_000_000


class Node:
    """A fake GPU node: NVML scenario installed, sysfs PCI tree, procfs with the GPU processes, kernel log."""

    def __init__(self, root: str, scenario: str | None, kmsg: str = "", settings: dict[str, Any] | None = None,
                 environ: dict[int, dict[str, str]] | None = None) -> None:
        self.root = root
        self.fake: FakeNvml | None = None
        template = load_scenario(scenario or "h100_8x_healthy")
        write_sysfs(template, os.path.join(root, "sys"))
        proc = os.path.join(root, "proc")
        os.makedirs(proc, exist_ok=True)
        with open(os.path.join(proc, "stat"), "w") as handle:
            handle.write(f"cpu 1 2 3\nbtime {BOOT}\n")
        for pid, env in (environ or {}).items():
            os.makedirs(os.path.join(proc, str(pid)))
            with open(os.path.join(proc, str(pid), "cgroup"), "w") as handle:
                job = env.get("SLURM_JOB_ID", "1")
                handle.write(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n")
            with open(os.path.join(proc, str(pid), "environ"), "w") as handle:
                handle.write("".join(f"{k}={v}\0" for k, v in env.items()))
        self.kmsg = os.path.join(root, "kmsg")
        with open(self.kmsg, "w") as handle:
            handle.write(kmsg)
        if scenario is not None:
            self.fake = template
            install(template)
        else:
            uninstall()
        self.config_flags = {
            "path.sysfs": os.path.join(root, "sys"), "path.procfs": proc, "path.kmsg": self.kmsg,
            "gpu.jobs-dir": os.path.join(root, "jobs"), **(settings or {}),
        }
        self.config = load(self.config_flags, environ={})

    def append_kmsg(self, text: str) -> None:
        with open(self.kmsg, "a") as handle:
            handle.write(text)


@pytest.fixture
def node(tmp_path) -> Iterator[Callable[..., Node]]:
    made: list[Node] = []
    collectors: list[GpuCollector] = []

    def make(scenario: str | None = "h100_8x_healthy", **kwargs: Any) -> Node:
        built = Node(str(tmp_path / f"node{len(made)}"), scenario, **kwargs)
        made.append(built)
        return built

    make.collectors = collectors  # type: ignore[attr-defined]
    yield make
    for built in made:
        if built.fake is not None:
            built.fake.release()
    uninstall()


def gpu_daemon(config: Config) -> Daemon:
    return build_daemon(config, collectors={"gpu": GpuCollector(config)})


def scrape(daemon: Daemon) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value} from a GET /metrics of the daemon app."""
    with TestClient(daemon.app) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def text_of(daemon: Daemon) -> str:
    with TestClient(daemon.app) as client:
        return client.get("/metrics").text


def value(metrics: dict, name: str, **labels: str) -> float | None:
    for key, val in metrics.get(name, {}).items():
        if all(dict(key).get(k) == v for k, v in labels.items()):
            return val
    return None


def collect_once(daemon: Daemon) -> None:
    for runner in daemon.engine.runners:
        reading = runner.run_once()
        assert reading.status in ("ok", "no_hardware"), reading.error


def close(daemon: Daemon) -> None:
    daemon.engine.stop()


# -- every metric, base units, promtool -------------------------------------------------------------

# The scenario's GPU i runs pid 4101 + i: rank 8 + i of job "llama" (this node is the job's second).
JOBS_ENV = {4101 + i: {"FLEETSCOPE_JOB": "llama", "SLURM_JOB_ID": "777", "RANK": str(8 + i), "LOCAL_RANK": str(i)}
            for i in range(8)}


def test_h100_every_metric_in_base_units_and_promtool_clean(node) -> None:
    n = node("h100_8x_healthy", environ=JOBS_ENV, settings={"gpu.expected-count": 8, "collector.gpu.detail": "all"},
             kmsg="4,1,5000000,-;NVRM: Xid (PCI:0000:53:00): 13, pid=4101, name=python3, Graphics Exception\n")
    # GPU 1 as a board with a fan and page retirement (an H100 SXM has neither), so those metrics show too
    n.fake.gpu(1).set(fan_percent=40, retired_pages_sbe=0, retired_pages_dbe=0, retired_pages_pending=0)
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    collect_once(daemon)  # GPM ratios need a second sample
    text = text_of(daemon)
    metrics = scrape(daemon)
    close(daemon)

    names = [spec.name for table in GpuCollector.tables for spec in table  # not: GPUs without GPM (tests/sources),
             if spec.name not in ("fleetscope_gpu_pcie_bytes_total", "fleetscope_gpu_allocation_info")  # kubelet:
             and "_mig_" not in spec.name]  # test_kubelet_*; MIG (test_mig_*)
    for name in names:  # every metric the collector's tables declare is exported on a healthy H100 node
        assert any(m == name or m == name.removesuffix("_info") + "_info" for m in metrics), f"{name} missing"

    g5 = {"gpu": "5", "uuid": n.fake.gpu(5).uuid}
    assert value(metrics, "fleetscope_gpu_power_watts", **g5) == pytest.approx(692.345)
    assert value(metrics, "fleetscope_gpu_power_limit_watts", **g5) == pytest.approx(700.0)
    assert value(metrics, "fleetscope_gpu_energy_joules_total", **g5) == pytest.approx(987654.321)
    assert value(metrics, "fleetscope_gpu_utilization_ratio", **g5) == pytest.approx(0.97)
    assert value(metrics, "fleetscope_gpu_memory_utilization_ratio", **g5) == pytest.approx(0.61)
    assert value(metrics, "fleetscope_gpu_memory_reserved_bytes", **g5) == 503316480
    assert value(metrics, "fleetscope_gpu_memory_used_bytes", **g5) == 73014444032
    assert value(metrics, "fleetscope_gpu_temperature_celsius", **g5) == 52
    assert value(metrics, "fleetscope_gpu_memory_temperature_celsius", **g5) == 61
    assert value(metrics, "fleetscope_gpu_slowdown_temperature_celsius", **g5) == 89
    assert value(metrics, "fleetscope_gpu_clock_hertz", clock="sm", **g5) == pytest.approx(1.32e9)
    assert value(metrics, "fleetscope_gpu_clock_max_hertz", clock="memory", **g5) == pytest.approx(2.619e9)
    assert value(metrics, "fleetscope_gpu_throttle_active", reason="sw_power_cap", **g5) == 1
    assert value(metrics, "fleetscope_gpu_throttle_active", reason="hw_thermal", **g5) == 0
    assert value(metrics, "fleetscope_gpu_throttle_seconds_total", reason="sw_power_cap", **g5) == pytest.approx(12.5)
    assert value(metrics, "fleetscope_gpu_throttle_seconds_total", reason="sw_thermal", **g5) == pytest.approx(1.5)
    ecc = value(metrics, "fleetscope_gpu_ecc_errors_total", error_type="corrected", counter_type="aggregate", **g5)
    assert ecc == 41
    assert value(metrics, "fleetscope_gpu_remapped_rows", cause="correctable", **g5) == 2
    assert value(metrics, "fleetscope_gpu_pcie_replays_total", **g5) == 7
    assert value(metrics, "fleetscope_gpu_pcie_link_generation", **g5) == 5
    assert value(metrics, "fleetscope_gpu_pcie_throughput_bytes_per_second", direction="rx", **g5) == 2500000 * 1024
    assert value(metrics, "fleetscope_gpu_nvlink_up", link="17", **g5) == 1
    assert value(metrics, "fleetscope_gpu_pcie_errors_total", severity="fatal", **g5) == 0
    assert value(metrics, "fleetscope_gpu_pcie_link_events_total", event="bad_tlp", **g5) == 0
    assert value(metrics, "fleetscope_gpu_retired_pages", cause="single_bit", **g5) is None  # H100: rows remap
    assert value(metrics, "fleetscope_gpu_sm_active_ratio", **g5) == pytest.approx(0.9625)
    assert value(metrics, "fleetscope_gpu_tensor_active_ratio", **g5) == pytest.approx(0.935)
    assert value(metrics, "fleetscope_gpu_processes", **g5) == 1
    assert value(metrics, "fleetscope_gpu_process_memory_bytes", **g5) == 70000000000
    assert value(metrics, "fleetscope_gpu_fan_speed_ratio", gpu="1") == pytest.approx(0.4)
    assert value(metrics, "fleetscope_gpu_fan_speed_ratio", **g5) is None  # SXM: absent, not 0
    assert value(metrics, "fleetscope_gpu_lost", **g5) == 0
    assert value(metrics, "fleetscope_gpu_nvml_devices") == 8
    assert value(metrics, "fleetscope_gpu_pci_devices") == 8
    assert value(metrics, "fleetscope_gpu_expected_devices") == 8
    assert value(metrics, "fleetscope_gpu_info", pci_bus_id="00000000:A8:00.0", architecture="hopper",
                 mig_mode="disabled", **g5) == 1
    assert value(metrics, "fleetscope_gpu_driver_info", driver_version="550.90.07", nvml_version="12.550.90.07") == 1
    assert value(metrics, "fleetscope_gpu_job_info", training_job="llama", rank="13", local_rank="5",
                 slurm_job_id="777", **g5) == 1
    g0 = {"gpu": "0", "uuid": n.fake.gpu(0).uuid}
    assert value(metrics, "fleetscope_gpu_xid_errors_total", xid="13", action="RESTART_APP", **g0) == 1
    assert value(metrics, "fleetscope_gpu_last_xid_timestamp_seconds", **g0) == pytest.approx(BOOT + 5)
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 1

    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_detail_folds_links_and_leaves_out_what_another_series_says(node) -> None:
    n = node("h100_8x_healthy")
    g2, g5 = n.fake.gpu(2), n.fake.gpu(5)
    g2.nvlink_up[11] = False
    g5.nvlink_errors["crc"] = [3] * 9 + [4] * 9
    g5.nvlink_errors["replay"] = [1] * 18
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    metrics = scrape(daemon)
    every = GpuCollector(load({**dict(n.config_flags), "collector.gpu.detail": "all"}, environ={}))
    every_names = {sample.name for family in every.collect() for sample in family.samples}
    every.close()
    close(daemon)

    assert value(metrics, "fleetscope_gpu_nvlink_up", gpu="2", uuid=g2.uuid) == 0  # one link down: the GPU's is
    assert value(metrics, "fleetscope_gpu_nvlink_up", gpu="5", uuid=g5.uuid) == 1
    assert len(metrics["fleetscope_gpu_nvlink_up"]) == 8  # no link label
    assert value(metrics, "fleetscope_gpu_nvlink_errors_total", gpu="5", error="crc") == 9 * 3 + 9 * 4
    assert value(metrics, "fleetscope_gpu_nvlink_errors_total", gpu="5", error="replay") == 18
    assert all("link" not in dict(key) for key in metrics["fleetscope_gpu_nvlink_errors_total"])
    assert "fleetscope_gpu_clock_max_hertz" not in metrics and "fleetscope_gpu_clock_max_hertz" in every_names
    # The 0/1 state only for reasons NVML keeps no time counter for: the rule reads the counter first.
    timed = {dict(key)["reason"] for key in metrics["fleetscope_gpu_throttle_seconds_total"]}
    sampled = {dict(key)["reason"] for key in metrics["fleetscope_gpu_throttle_active"]}
    assert timed and sampled and not timed & sampled and "hw_slowdown" in sampled
    assert value(metrics, "fleetscope_gpu_throttle_active", gpu="5", reason="hw_slowdown") == 0


def test_expected_devices_absent_unless_configured(node) -> None:
    n = node("a100_8x")
    collector = GpuCollector(n.config)
    names = {f.name for f in collector.collect()}
    collector.close()
    assert "fleetscope_gpu_expected_devices" not in names and "fleetscope_gpu_pci_devices" in names
    assert "fleetscope_gpu_sm_active_ratio" not in names  # no GPM on Ampere


# -- a GPU lost mid-run -----------------------------------------------------------------------------


def test_gpu_lost_mid_run_others_keep_reporting(node) -> None:
    n = node("h100_8x_healthy", settings={"gpu.lost-retry": "1h"})
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    n.fake.lose(3)
    collect_once(daemon)
    metrics = scrape(daemon)
    uuid3 = n.fake.gpu(3).uuid
    assert value(metrics, "fleetscope_gpu_lost", gpu="3", uuid=uuid3) == 1
    assert value(metrics, "fleetscope_gpu_temperature_celsius", gpu="3") is None
    assert value(metrics, "fleetscope_gpu_info", gpu="3", uuid=uuid3) == 1  # identity stays joinable
    for other in (0, 1, 2, 4, 5, 6, 7):
        assert value(metrics, "fleetscope_gpu_lost", gpu=str(other)) == 0
        assert value(metrics, "fleetscope_gpu_temperature_celsius", gpu=str(other)) == 52
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 1
    # Not retried before gpu.lost-retry, even though it would answer now.
    n.fake.recover(3)
    collect_once(daemon)
    assert value(scrape(daemon), "fleetscope_gpu_lost", gpu="3") == 1
    close(daemon)


def test_lost_gpu_is_retried_and_comes_back(node) -> None:
    n = node("lost_gpu", settings={"gpu.lost-retry": "1ms"})
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    assert value(scrape(daemon), "fleetscope_gpu_lost", gpu="3") == 1
    n.fake.recover(3)
    time.sleep(0.01)  # past the 1 ms retry interval
    collect_once(daemon)
    metrics = scrape(daemon)
    assert value(metrics, "fleetscope_gpu_lost", gpu="3", uuid=n.fake.gpu(3).uuid) == 0
    assert value(metrics, "fleetscope_gpu_temperature_celsius", gpu="3") == 52
    close(daemon)


# -- older driver, hanging call, no library -----------------------------------------------------------


def test_older_driver_still_reports(node) -> None:
    n = node("older_driver", settings={"collector.gpu.detail": "all"})
    collector = GpuCollector(n.config)
    families = {f.name: f for f in collector.collect()}
    collector.close()
    temps = [s.value for s in families["fleetscope_gpu_temperature_celsius"].samples]
    assert temps == [52] * 8
    throttle = {
        (s.labels["gpu"], s.labels["reason"]): s.value for s in families["fleetscope_gpu_throttle_active"].samples
    }
    assert throttle[("0", "sw_power_cap")] == 1 and len(throttle) == 8 * 9
    assert len(families["fleetscope_gpu_processes"].samples) == 8
    assert "fleetscope_gpu_memory_reserved_bytes" not in families  # v1 memory info has no reserved
    info = families["fleetscope_gpu_driver"].samples[0].labels  # an info family is named without _info
    assert info["driver_version"] == "525.147.05"


def test_hanging_call_is_cut_off_and_metrics_keep_answering(node) -> None:
    n = node("hanging_call", settings={"collector.gpu.timeout": "300ms"})
    daemon = gpu_daemon(n.config)
    [runner] = daemon.engine.runners
    assert runner.run_once().status == "timeout"
    metrics = scrape(daemon)
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 0
    assert runner.run_once().status == "timeout"  # no second attempt stacked on the stuck one
    n.fake.release()
    runner._worker.join(240)  # a hang guard
    runner.timeout = 240.0  # the 300 ms that made the hang a timeout would judge a loaded machine's speed next
    assert runner.run_once().status == "ok"
    assert value(scrape(daemon), "fleetscope_gpu_power_watts", gpu="0") == pytest.approx(692.345)
    close(daemon)


def test_no_nvml_library_daemon_serves_everything_else(node) -> None:
    n = node(None)  # uninstalls any fake: pynvml looks for the real libnvidia-ml.so.1, which is absent here
    config = load({
        "path.sysfs": os.path.join(FIXTURES, "p5", "sys"), "path.procfs": os.path.join(FIXTURES, "p5", "proc"),
        "path.kmsg": n.kmsg, "collector.ena": False,
    }, environ={})
    daemon = build_daemon(config)
    assert "gpu" in daemon.collectors
    daemon.engine.start()
    try:
        assert daemon.engine.wait_ready(30)
        metrics = scrape(daemon)
    finally:
        daemon.engine.stop()
    assert value(metrics, "fleetscope_collector_hardware_present", collector="gpu") == 0
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 1
    assert value(metrics, "fleetscope_collector_hardware_present", collector="efa") == 1
    assert value(metrics, "fleetscope_efa_devices") == 32
    assert not [name for name in metrics if name.startswith("fleetscope_gpu_")]
    with pytest.raises(NoHardware):
        GpuCollector(config).collect()


def test_expected_gpus_with_none_visible_is_unhealthy_and_exported(node) -> None:
    """A driver that failed to load is what gpu.expected-count is for (#35 item 8): before, no NVML library and
    nothing on the PCI bus read as "no GPU hardware here", HEALTHY, with no expected count for GpuMissing."""
    n = node(None)
    config = load({
        "path.sysfs": os.path.join(FIXTURES, "p5", "sys"), "path.procfs": os.path.join(FIXTURES, "p5", "proc"),
        "path.kmsg": n.kmsg, "collector.ena": False, "gpu.expected-count": 8,
    }, environ={})
    findings, code = run_check(config, timeout=20, collectors={"gpu": GpuCollector(config)})
    assert code == EXIT_UNHEALTHY
    (finding,) = findings
    assert finding.line().startswith("UNHEALTHY gpu: node: no GPU visible, 8 expected: none on the PCI bus, NVML ")
    daemon = build_daemon(config)
    daemon.engine.start()
    try:
        assert daemon.engine.wait_ready(30)
        metrics = scrape(daemon)
    finally:
        daemon.engine.stop()
    assert value(metrics, "fleetscope_gpu_expected_devices") == 8
    assert value(metrics, "fleetscope_gpu_pci_devices") == 0
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 0
    assert value(metrics, "fleetscope_collector_hardware_present", collector="gpu") == 1


# -- Xids: kernel log formats, NVML events, one count per occurrence --------------------------------


def xid_counts(metrics: dict) -> dict[tuple[str, str, str], float]:
    return {(dict(k)["gpu"], dict(k)["xid"], dict(k)["action"]): v
            for k, v in metrics.get("fleetscope_gpu_xid_errors_total", {}).items()}


EXPECTED_KMSG = {
    ("0", "13", "RESTART_APP"): 2, ("0", "79", "RESTART_BM"): 1, ("1", "31", "RESTART_APP"): 1,
    ("2", "31", "RESTART_APP"): 1, ("3", "32", "RESTART_APP"): 1, ("4", "13", "RESTART_APP"): 1,
    ("5", "149", "WORKFLOW_NVLINK5_ERR"): 1, ("6", "154", "FOLLOW_RECOVERY_ACTION"): 1, ("7", "79", "RESTART_BM"): 1,
}


def test_kernel_log_variants_count_per_gpu(node) -> None:
    with open(VARIANTS) as handle:
        n = node("h100_8x_healthy", kmsg=handle.read())
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    collect_once(daemon)  # the log is followed, not re-read
    metrics = scrape(daemon)
    close(daemon)
    assert xid_counts(metrics) == EXPECTED_KMSG
    assert value(metrics, "fleetscope_gpu_xid_errors_total", gpu="7", uuid=n.fake.gpu(7).uuid, xid="79") == 1


def test_kernel_log_without_nvml_identifies_gpus_by_pci(node) -> None:
    with open(VARIANTS) as handle:
        n = node(None, kmsg=handle.read(), settings={"gpu.xid-window": "1000000h"})
    collector = GpuCollector(n.config)
    daemon = build_daemon(n.config, collectors={"gpu": collector})
    [runner] = daemon.engine.runners
    assert runner.run_once().status == "partial"  # served, but blind without NVML: a failure (#18 item 10)
    metrics = scrape(daemon)
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 0
    assert xid_counts(metrics) == EXPECTED_KMSG
    # uuid from the driver's "GPU at PCI:" line where the log has one, else empty
    assert value(metrics, "fleetscope_gpu_xid_errors_total", gpu="0", xid="79",
                 uuid="GPU-11111111-2222-3333-4444-555555555555") == 1
    assert value(metrics, "fleetscope_gpu_xid_errors_total", gpu="7", xid="79", uuid="") == 1
    assert value(metrics, "fleetscope_gpu_pci_devices") == 8
    assert value(metrics, "fleetscope_gpu_nvml_devices") is None
    assert value(metrics, "fleetscope_collector_hardware_present", collector="gpu") == 1
    findings, code = run_check(n.config, collectors={"gpu": collector})
    assert code == EXIT_UNHEALTHY
    assert any("NVML unavailable" in f.message for f in findings)
    assert any(f.subject == "gpu 7" and "Xid 79" in f.message for f in findings), findings


def wait_for(predicate: Callable[[], bool], timeout: float = 240.0) -> bool:
    """A hang guard: returns once ``predicate`` holds, within at least 240 s however small ``timeout`` is."""
    return bool(eventually(predicate, max(timeout, 240.0), interval=0.02))


def test_nvml_event_and_kernel_log_line_count_once(node) -> None:
    n = node("xid_events")
    daemon = gpu_daemon(n.config)
    collector: GpuCollector = daemon.collectors["gpu"]
    collect_once(daemon)  # starts the event watcher; the scenario's pending events arrive on registration
    assert wait_for(lambda: sum(collector._ledger.counts().values()) >= 4)
    # The same Xid 79 of GPU 5, as the kernel logged it (stamped now, in usec since boot).
    usec = int((time.time() - BOOT) * 1e6)
    n.append_kmsg(f"4,9,{usec},-;NVRM: Xid (PCI:0000:a8:00): 79, pid=4106, name=python3, GPU has fallen off the bus.\n")
    collect_once(daemon)
    metrics = scrape(daemon)
    counts = xid_counts(metrics)
    assert counts[("5", "79", "RESTART_BM")] == 1
    assert counts[("0", "13", "RESTART_APP")] == 2  # two identical Xids are two errors
    assert counts[("2", "48", "WORKFLOW_XID_48")] == 1
    # A later repeat is a new occurrence: the counter moves.
    n.fake.inject_xid(5, 79)
    assert wait_for(lambda: collector._ledger.counts().get(
        (collector._nvml.identity(5).pci, 79)) == 2)  # type: ignore[union-attr]
    collect_once(daemon)
    assert xid_counts(scrape(daemon))[("5", "79", "RESTART_BM")] == 2
    close(daemon)


# -- health ----------------------------------------------------------------------------------------


def test_healthy_node_checks_healthy(node) -> None:
    n = node("h100_8x_healthy", settings={"gpu.expected-count": 8})
    findings, code = run_check(n.config, collectors={"gpu": GpuCollector(n.config)})
    assert (findings, code) == ([], EXIT_HEALTHY)


def test_health_findings(node) -> None:
    n = node("h100_8x_healthy", settings={"gpu.expected-count": 9})
    n.fake.gpu(1).set(remapped_rows={"failure": 1}, recovery_action=2)
    n.fake.gpu(2).set(ecc={"uncorrected_volatile": 4}, remapped_rows={"pending": 1})
    n.fake.gpu(6).nvlink_up[3] = False
    n.fake.lose(4)
    n.append_kmsg("4,1,1000,-;NVRM: Xid (PCI:0000:75:00): 13, pid=1, name=p, Graphics Exception\n")
    usec = int((time.time() - BOOT) * 1e6)
    n.append_kmsg(f"4,2,{usec},-;NVRM: Xid (PCI:0000:ca:00): 119, pid=1, name=p, Timeout after 6s of waiting\n")
    findings, code = run_check(n.config, collectors={"gpu": GpuCollector(n.config)})
    lines = sorted(f"{f.subject}: {f.message}" for f in findings)
    assert code == EXIT_UNHEALTHY
    assert lines == sorted([
        "node: 8 of 9 expected GPUs on the PCI bus",
        "node: NVML sees 8 GPUs, 9 expected",
        "gpu 1: row remapping failed",
        "gpu 1: driver recovery action: node reboot required",
        "gpu 2: 4 uncorrectable ECC errors since driver load",
        "gpu 2: row remap pending: reset the GPU",
        "gpu 4: lost (NVML: GPU is lost; fallen off the bus?)",
        "gpu 6: NVLink down: link 3",
        "gpu 7: Xid 119 (RESET_GPU) x1 in the last 3600s",
    ])  # the old, application-level Xid 13 is no finding


# -- packaging -------------------------------------------------------------------------------------


def test_collector_imports_without_loading_pynvml() -> None:
    code = ("import sys; from fleetscope.collectors.gpu import GpuCollector; GpuCollector.tables; "
            "from fleetscope.metrics.catalog import render_catalog; "
            "assert 'pynvml' not in sys.modules, 'pynvml imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_job_info_has_no_per_pid_labels() -> None:
    from fleetscope.metrics.gpu import JOB_INFO

    assert not re.search(r"pid", " ".join(JOB_INFO.all_labels))


def test_every_value_the_nvml_reader_names_has_a_metric() -> None:
    from typing import get_args

    from fleetscope.metrics import gpu
    from fleetscope.sources.nvml import NvmlValue

    assert set(get_args(NvmlValue)) == set(gpu.NVML_TABLE.specs) - {
        "info", "driver_info", "lost", "nvml_devices", "fabric_info", "mig_info"}


# -- #18 item 11: an Xid seen by either source is never dropped -------------------------------------


def test_xid_on_one_gpu_is_counted_while_another_falls_off_the_bus(node) -> None:
    n = node("h100_8x_healthy")
    daemon = gpu_daemon(n.config)
    collector: GpuCollector = daemon.collectors["gpu"]
    collect_once(daemon)  # starts watching NVML events
    assert wait_for(lambda: collector._nvml._watcher is not None)
    time.sleep(0.3)  # the watcher(s) registered
    n.fake.lose(6)
    n.fake.inject_xid(3, 94)  # at the same moment
    assert wait_for(lambda: sum(collector._ledger.counts().values()) >= 1, timeout=10), "Xid 94 never arrived"
    collect_once(daemon)
    metrics = scrape(daemon)
    assert xid_counts(metrics)[("3", "94", "RESTART_APP")] == 1
    assert value(metrics, "fleetscope_gpu_lost", gpu="6") == 1
    n.fake.inject_xid(3, 94)  # and the watch on the healthy GPUs goes on
    assert wait_for(lambda: sum(collector._ledger.counts().values()) >= 2, timeout=10)
    close(daemon)


def test_kernel_log_xids_count_with_no_gpu_left_on_the_bus(node, tmp_path) -> None:
    """Driver and GPUs gone: NVML does not load and the PCI bus shows no NVIDIA GPU, but the kernel logged Xid 79."""
    n = node(None, kmsg="6,1,1000000,-;NVRM: GPU at PCI:0000:53:00: GPU-11111111-2222-3333-4444-555555555555\n"
                        "4,2,3000000,-;NVRM: Xid (PCI:0000:53:00): 79, pid=4101, name=python3, GPU has fallen off "
                        "the bus.\n", settings={"gpu.xid-window": "1000000h"})
    empty_sysfs = tmp_path / "bare-sys"
    (empty_sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    config = load({"path.sysfs": str(empty_sysfs), "path.procfs": os.path.join(n.root, "proc"),
                   "path.kmsg": n.kmsg, "gpu.xid-window": "1000000h"}, environ={})
    collector = GpuCollector(config)
    daemon = build_daemon(config, collectors={"gpu": collector})
    [runner] = daemon.engine.runners
    assert runner.run_once().status == "partial"  # served, and reported as a failure: NVML is gone
    metrics = scrape(daemon)
    assert value(metrics, "fleetscope_gpu_xid_errors_total", xid="79") == 1
    assert value(metrics, "fleetscope_gpu_pci_devices") == 0
    findings, code = run_check(config, collectors={"gpu": GpuCollector(config)})
    assert code == EXIT_UNHEALTHY and any("Xid 79" in f.message for f in findings)


def test_xid_series_are_bounded_by_the_nodes_gpus_and_the_catalog(node) -> None:
    """Distinct (address, code) keys from the log no longer each make a series (#35 item 6)."""
    lines = [f"4,{n},{1000 + n},-;NVRM: Xid (PCI:{n // 256:04x}:{n % 256:02x}:00): {200 + n % 500}, x\n"
             for n in range(2000)]
    lines.append("4,3000,5000000,-;NVRM: Xid (PCI:0000:53:00): 13, pid=4101, name=python3, Graphics Exception\n")
    n = node("h100_8x_healthy", kmsg="".join(lines))
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    metrics = scrape(daemon)
    close(daemon)
    counts = xid_counts(metrics)
    assert sum(counts.values()) == 2001  # every occurrence still counted
    assert {gpu for gpu, _, _ in counts} <= {*map(str, range(8)), "other"}
    assert {xid for _, xid, _ in counts} == {"13", "unknown"}
    assert counts[("0", "13", "RESTART_APP")] == 1 and counts[("other", "unknown", "UNKNOWN")] > 1900


# -- #38: NVLink fabric registration, NVLink traffic, MIG instances -------------------------------------------


def test_fabric_manager_down_is_an_unhealthy_finding_and_a_state_per_gpu(node) -> None:
    n = node("fabric_manager_down")
    collector = GpuCollector(n.config)
    findings = {(f.subject, f.severity): f.message for f in collector.health()}
    families = {f.name: f for f in collector.collect()}
    collector.close()
    assert "nvidia-fabricmanager" in findings[("gpu 0", "unhealthy")]
    assert findings[("gpu 6", "warning")] == "NVLink fabric registration in progress"
    assert findings[("gpu 7", "unhealthy")] == "NVLink fabric registration failed: NVML_ERROR_INSUFFICIENT_RESOURCES"
    states = {s.labels["gpu"]: s.value for s in families["fleetscope_gpu_fabric_state"].samples}
    assert states == {**{str(i): 1.0 for i in range(6)}, "6": 2.0, "7": 3.0}
    assert [(s.labels["gpu"], s.value) for s in families["fleetscope_gpu_fabric_status"].samples] == [("7", 23.0)]
    assert [s.labels["gpu"] for s in families["fleetscope_gpu_fabric"].samples] == ["7"]  # the info: once completed


def test_a_registered_fabric_and_one_without_nvswitch_are_no_finding(node) -> None:
    n = node("h100_8x_healthy")
    n.fake.gpu(1).set(fabric={"state": 0, "cluster_uuid": ""})  # not on an NVSwitch fabric: not supported
    n.fake.gpu(2).set(fabric=None)  # the call is not supported at all
    collector = GpuCollector(n.config)
    assert [f for f in collector.health() if "fabric" in f.message.lower()] == []
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    metrics = scrape(daemon)
    close(daemon)
    collector.close()
    assert value(metrics, "fleetscope_gpu_fabric_state", gpu="1") == 0
    assert value(metrics, "fleetscope_gpu_fabric_state", gpu="2") is None  # missing is not zero
    assert value(metrics, "fleetscope_gpu_fabric_info", gpu="0", clique_id="32766",
                 cluster_uuid="5f1c2a9e-7b3d-4c8e-9a61-0d2e4f6a8b10") == 1


def test_nvlink_traffic_per_gpu_by_default_and_per_link_at_detail_all(node) -> None:
    for detail, expected in (("default", 2), ("all", 36)):
        n = node("h100_8x_healthy", settings={"collector.gpu.detail": detail})
        n.fake.gpu(3).set(nvlink_mibps={"tx": [10.0] * 18, "rx": [5.0] * 18})
        daemon = gpu_daemon(n.config)
        collect_once(daemon)
        collect_once(daemon)
        metrics = scrape(daemon)
        close(daemon)
        series = {(dict(k).get("link"), dict(k)["direction"]): v
                  for k, v in metrics["fleetscope_gpu_nvlink_bytes_total"].items() if dict(k)["gpu"] == "3"}
        assert len(series) == expected and all(v > 0 for v in series.values())


def test_mig_instances_their_memory_activity_and_jobs(node) -> None:
    env = {4101: {"FLEETSCOPE_JOB": "llama", "SLURM_JOB_ID": "777", "RANK": "0"},
           4201: {"FLEETSCOPE_JOB": "notebook", "SLURM_JOB_ID": "778", "RANK": "0"}}
    n = node("mig_enabled", environ=env)
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    collect_once(daemon)  # per-instance GPM ratios need two samples
    metrics = scrape(daemon)
    close(daemon)
    g0 = {"gpu": "0", "uuid": n.fake.gpu(0).uuid}
    names = {dict(k)["gpu_instance"]: dict(k)["name"] for k in metrics["fleetscope_gpu_mig_info"]
             if dict(k)["gpu"] == "0" and dict(k)["compute_instance"] == "0"}
    assert names == {"1": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "5": "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
                     "13": "NVIDIA H100 80GB HBM3 MIG 1g.10gb"}
    assert value(metrics, "fleetscope_gpu_mig_memory_used_bytes", **g0, gpu_instance="1") == 30000000000
    assert value(metrics, "fleetscope_gpu_mig_memory_total_bytes", **g0, gpu_instance="13") == 10468982784
    assert value(metrics, "fleetscope_gpu_mig_sm_active_ratio", **g0, gpu_instance="1") == pytest.approx(0.885)
    assert value(metrics, "fleetscope_gpu_mig_job_info", **g0, gpu_instance="1", training_job="llama") == 1
    assert value(metrics, "fleetscope_gpu_mig_job_info", **g0, gpu_instance="5", training_job="notebook") == 1
    assert value(metrics, "fleetscope_gpu_mig_job_info", gpu="0", gpu_instance="13") is None  # nothing runs there
    assert value(metrics, "fleetscope_gpu_job_info", **g0, training_job="notebook") == 1  # the GPU's too
    assert value(metrics, "fleetscope_gpu_mig_info", gpu="6") is None  # GPU 6 is whole


# -- #38 item 4: pod attribution through the kubelet's pod-resources API ------------------------------------


def test_kubelet_allocations_label_every_allocated_gpu_and_mig_device_idle_or_not(node, tmp_path) -> None:
    from tests.kubelet import kubelet, response

    socket = str(tmp_path / "kubelet.sock")
    n = node("mig_enabled", settings={"gpu.pod-resources-socket": socket})
    whole = [n.fake.gpu(6).uuid, n.fake.gpu(7).uuid]
    mig = n.fake.gpu(0).mig_devices[2]["uuid"]
    pods = [
        {"name": "llama-0", "namespace": "train", "containers": [
            {"name": "trainer", "devices": [("nvidia.com/gpu", whole), ("vpc.amazonaws.com/efa", ["0"])]}]},
        {"name": "notebook", "namespace": "research", "containers": [
            {"name": "jupyter", "devices": [("nvidia.com/mig-1g.10gb", [mig])]}]},
    ]
    daemon = gpu_daemon(n.config)
    with kubelet(socket, response(pods)) as requests:
        collect_once(daemon)
        collect_once(daemon)  # within the slow interval: the kubelet is not asked again
    metrics = scrape(daemon)
    close(daemon)
    assert len(requests) == 1
    series = {tuple(dict(k)[label] for label in ("gpu", "uuid", "pod", "namespace", "container", "resource",
                                                 "device")): v
              for k, v in metrics["fleetscope_gpu_allocation_info"].items()}
    g0 = n.fake.gpu(0).uuid
    assert series == {
        ("6", whole[0], "llama-0", "train", "trainer", "nvidia.com/gpu", whole[0]): 1,
        ("7", whole[1], "llama-0", "train", "trainer", "nvidia.com/gpu", whole[1]): 1,
        ("0", g0, "notebook", "research", "jupyter", "nvidia.com/mig-1g.10gb", mig): 1,
    }
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 1


def test_an_unreachable_kubelet_is_a_failed_collection_that_still_serves_the_gpus(node, tmp_path) -> None:
    n = node("h100_8x_healthy", settings={"gpu.pod-resources-socket": str(tmp_path / "absent.sock")})
    daemon = gpu_daemon(n.config)
    reading = daemon.engine.runners[0].run_once()
    assert reading.status == "partial" and "kubelet pod-resources" in (reading.error or "")
    metrics = scrape(daemon)
    close(daemon)
    assert "fleetscope_gpu_allocation_info" not in metrics
    assert value(metrics, "fleetscope_gpu_memory_used_bytes", gpu="0") is not None
    assert value(metrics, "fleetscope_collector_success", collector="gpu") == 0


def test_without_the_setting_the_kubelet_is_never_asked(node) -> None:
    n = node("h100_8x_healthy")
    assert n.config.gpu.pod_resources_socket == ""
    daemon = gpu_daemon(n.config)
    collect_once(daemon)
    metrics = scrape(daemon)
    close(daemon)
    assert "fleetscope_gpu_allocation_info" not in metrics
