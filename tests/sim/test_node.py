from __future__ import annotations

import json
import os
import pathlib

from fleetscope.sources.efa import read_efa
from fleetscope.sources.fs import Root
from fleetscope.sources.netdev import read_netdev
from fleetscope.sources.netstat import read_netstat
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.node import Load, NodeModel
from fleetscope_sim.profiles import P4D, P5, profile
from fleetscope_sim.tree import NodePaths, TreeWriter

BUSY = Load(gpu_busy=dict.fromkeys(range(8), 0.95), network=0.95)


def _node(scratch, prof=P4D, name="node-00"):
    model = NodeModel(name, 0, prof, seed=5)
    writer = TreeWriter(model, NodePaths(str(scratch / name)))
    writer.setup()
    return model, writer


def _run(model, writer, seconds, faults=(), start=0.0, load=BUSY):
    for t in range(int(seconds)):
        model.tick(1.0, start + t, load, list(faults))
        writer.update()


def test_profiles_match_the_real_instance_types():
    assert (P5.gpu_count, P5.efa_count, P4D.gpu_count, P4D.efa_count) == (8, 32, 8, 4)
    assert len(set(P5.efa_devices)) == 32 and "rdmap79s0" in P5.efa_devices and "rdmap201s0" in P5.efa_devices
    assert profile("p4d") is P4D


def test_the_real_sources_read_the_generated_tree(scratch):
    model, writer = _node(scratch, P5)
    _run(model, writer, 3)
    sysfs = Root(writer.paths.sysfs)
    efa = read_efa(sysfs)
    assert [d.name for d in efa.devices] == sorted(P5.efa_devices)
    device = next(d for d in efa.devices if d.name == "rdmap79s0")
    assert device.pci_address == "0000:4f:00.0"  # rdmap79s0: bus 79 decimal
    assert device.ports[0].counters.values["tx_bytes"] > 0
    assert device.ports[0].rate_bytes_per_second == 100e9 / 8
    nics = {n.name: n for n in read_netdev(sysfs, exclude="^lo$")}
    assert nics["ens32"].driver == "ena" and nics["ens32"].stats["rx_bytes"] > 0
    tcp = read_netstat(Root(writer.paths.procfs))
    assert tcp.get("Tcp.OutSegs") > 0 and tcp.get("TcpExt.TCPTimeouts") is not None


def test_counters_only_grow_and_follow_the_load(scratch):
    model, writer = _node(scratch)
    _run(model, writer, 5)
    before = dict(model.efa[0].port)
    _run(model, writer, 5, start=5)
    assert all(model.efa[0].port[k] >= v for k, v in before.items())
    busy_rate = model.efa[0].port["tx_bytes"] - before["tx_bytes"]
    idle_before = model.efa[0].port["tx_bytes"]
    _run(model, writer, 5, start=10, load=Load())
    assert model.efa[0].port["tx_bytes"] - idle_before < busy_rate / 10
    assert all(g.utilization == 0 and "gpu_idle" in g.throttle for g in model.gpus)


def test_efa_faults_move_their_counters_on_their_device_only(scratch):
    model, writer = _node(scratch)
    faults = parse_schedule([
        {"kind": "efa_retransmits", "at": 0, "node": "node-00", "device": "rdmap32s27"},
        {"kind": "efa_rx_drops", "at": 0, "node": "node-00", "device": "rdmap144s27"},
        {"kind": "efa_impaired", "at": 0, "node": "node-00", "device": "rdmap160s27"},
        {"kind": "efa_device_missing", "at": 5, "node": "node-00", "device": "rdmap16s27"},
        {"kind": "efa_rx_drops", "at": 0, "node": "node-01"},  # another node: no effect here
    ])
    _run(model, writer, 10, faults)
    by_name = {e.name: e for e in model.efa}
    assert by_name["rdmap32s27"].port["retrans_pkts"] > 10_000
    assert by_name["rdmap32s27"].port["retrans_timeout_events"] > 5
    assert by_name["rdmap144s27"].port["rx_drops"] > 1000
    assert by_name["rdmap160s27"].port["impaired_remote_conn_events"] >= 3
    assert by_name["rdmap144s27"].port["retrans_pkts"] < 50 and by_name["rdmap32s27"].port["rx_drops"] == 0
    devices = [d.name for d in read_efa(Root(writer.paths.sysfs)).devices]
    assert devices == ["rdmap144s27", "rdmap160s27", "rdmap32s27"]


def test_gpu_faults_reach_the_gpu_state_file_and_the_kernel_log(scratch):
    model, writer = _node(scratch, P5)
    faults = parse_schedule([
        {"kind": "thermal_throttle", "at": 0, "node": "node-00", "gpu": 1},
        {"kind": "hw_slowdown", "at": 0, "node": "node-00", "gpu": 2},
        {"kind": "xid", "at": 3, "node": "node-00", "gpu": 4, "params": {"xid": 79}},
        {"kind": "xid", "at": 3, "node": "node-00", "gpu": 5, "params": {"xid": 48}},
        {"kind": "ecc_uncorrectable", "at": 0, "node": "node-00", "gpu": 6},
        {"kind": "row_remap_pending", "at": 0, "node": "node-00", "gpu": 7},
    ])
    _run(model, writer, 20, faults)
    state = json.loads(pathlib.Path(writer.paths.gpu_state).read_text())["gpus"]
    assert state[1]["sm_clock_mhz"] < 0.7 * P5.gpu.sm_clock_max_mhz and "hw_thermal" in state[1]["throttle"]
    assert state[1]["temperature_c"] > 80 and state[0]["temperature_c"] < 75
    assert state[1]["throttle_seconds"]["hw_thermal"] >= 19
    assert "hw_slowdown" in state[2]["throttle"] and state[0]["throttle"] == []
    assert state[4]["lost"] and state[4]["xids"] == [79] and state[5]["xids"] == [48] and state[3]["xids"] == []
    assert state[6]["xids"] == [48]  # the DBE's Xid, once
    assert state[6]["ecc_uncorrected"] == 2 and state[7]["remap_pending"] and not state[0]["remap_pending"]
    kmsg = pathlib.Path(writer.paths.kmsg).read_text().splitlines()
    assert len(kmsg) == 3  # each Xid is logged once, not every tick
    assert "Xid (PCI:0000:b9:00): 48, pid=4242, name=python3, An uncorrectable double bit error" in kmsg[0]  # at 0 s
    assert kmsg[1].endswith(
        "NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert "NVRM: Xid (PCI:0000:a8:00): 48," in kmsg[2]


def test_network_faults_on_the_nic_and_tcp(scratch):
    model, writer = _node(scratch)
    _run(model, writer, 10)
    quiet = (model.tcp["RetransSegs"], model.tcp["OutSegs"])
    faults = parse_schedule([
        {"kind": "tcp_retransmit_storm", "at": 0, "node": "node-00"},
        {"kind": "ena_pps_exceeded", "at": 0, "node": "node-00"},
    ])
    _run(model, writer, 10, faults, start=10)
    ratio_quiet = quiet[0] / quiet[1]
    ratio_storm = (model.tcp["RetransSegs"] - quiet[0]) / (model.tcp["OutSegs"] - quiet[1])
    assert ratio_quiet < 0.005
    assert ratio_storm > 0.05
    ena = json.loads(pathlib.Path(writer.paths.ena_stats).read_text())["ens32"]
    assert ena["pps_allowance_exceeded"] > 5000 and ena["bw_out_allowance_exceeded"] == 0


def test_files_are_replaced_whole(scratch):
    model, writer = _node(scratch)
    _run(model, writer, 2)
    leftovers = [f for _, _, files in os.walk(writer.paths.root) for f in files if f.endswith(".tmp")]
    assert leftovers == []
