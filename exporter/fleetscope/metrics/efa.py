"""EFA devices: per-port traffic, RDMA and SRD counters, per-device admin and verbs counters.

Port counters are keyed by their file in ``ports/<n>/hw_counters/``, device
counters by their file in ``hw_counters/``; a counter file no spec names is
exported under :data:`PORT_HW_STAT_TOTAL` or :data:`DEVICE_HW_STAT_TOTAL`.
"""

from __future__ import annotations

from fleetscope.metrics.spec import AtDefault, MetricSpec, table

PREFIX = "fleetscope_efa_"
_PORT = ("device", "port")
_DEVICE = ("device",)

# At the default detail level a node's 32 EFA devices (p5) are one: an EC2 instance's EFA devices are not
# replaced one by one (the remedy for a failing device is the instance's), the alerts and the straggler
# cause name the node, and the fabric dashboards sum per node. Admin-queue failures were per device; at
# 2,048 nodes their alert read 65,536 series twice a minute (the most costly rule of the fleet benchmark)
# to name a device nobody replaces alone: `--collector.efa.detail=all` shows which one.
PER_NODE = AtDefault((), why="alerts and fabric dashboards read the node")


def _port(raw: str, name: str, help: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name, "counter", help, _PORT, unit=unit, raw=f"ports/<n>/hw_counters/{raw}",
                      at_default=PER_NODE)


def _device(raw: str, name: str, help: str) -> MetricSpec:
    return MetricSpec(name, "counter", help, _DEVICE, raw=f"hw_counters/{raw}", at_default=PER_NODE)


def _file(spec: MetricSpec) -> tuple[str, MetricSpec]:
    """A table row keyed by the counter's file name."""
    return spec.raw.rpartition("/")[2], spec


TX_BYTES_TOTAL = _port("tx_bytes", "fleetscope_efa_tx_bytes_total", "Bytes transmitted by the port.", "bytes")
TX_PACKETS_TOTAL = _port("tx_pkts", "fleetscope_efa_tx_packets_total", "Packets transmitted by the port.")
RX_BYTES_TOTAL = _port("rx_bytes", "fleetscope_efa_rx_bytes_total", "Bytes received by the port.", "bytes")
RX_PACKETS_TOTAL = _port("rx_pkts", "fleetscope_efa_rx_packets_total", "Packets received by the port.")
RX_DROPS_TOTAL = _port("rx_drops", "fleetscope_efa_rx_drops_total", "Packets received and then dropped.")
SEND_BYTES_TOTAL = _port(
    "send_bytes", "fleetscope_efa_send_bytes_total", "Bytes of send operations.", "bytes")
SEND_WORK_REQUESTS_TOTAL = _port("send_wrs", "fleetscope_efa_send_work_requests_total", "Send work requests.")
RECV_BYTES_TOTAL = _port(
    "recv_bytes", "fleetscope_efa_recv_bytes_total", "Bytes of receive operations.", "bytes")
RECV_WORK_REQUESTS_TOTAL = _port(
    "recv_wrs", "fleetscope_efa_recv_work_requests_total", "Receive work requests.")
RDMA_READ_WORK_REQUESTS_TOTAL = _port(
    "rdma_read_wrs", "fleetscope_efa_rdma_read_work_requests_total", "RDMA read work requests.")
RDMA_READ_BYTES_TOTAL = _port(
    "rdma_read_bytes", "fleetscope_efa_rdma_read_bytes_total", "Bytes read by RDMA reads.", "bytes")
RDMA_READ_WORK_REQUEST_ERRORS_TOTAL = _port(
    "rdma_read_wr_err", "fleetscope_efa_rdma_read_work_request_errors_total",
    "RDMA read work requests that completed with an error.")
RDMA_READ_RESPONSE_BYTES_TOTAL = _port(
    "rdma_read_resp_bytes", "fleetscope_efa_rdma_read_response_bytes_total",
    "Bytes sent in responses to remote RDMA reads.", "bytes")
RDMA_WRITE_WORK_REQUESTS_TOTAL = _port(
    "rdma_write_wrs", "fleetscope_efa_rdma_write_work_requests_total",
    "RDMA write work requests (0 on devices without RDMA write).")
RDMA_WRITE_BYTES_TOTAL = _port(
    "rdma_write_bytes", "fleetscope_efa_rdma_write_bytes_total", "Bytes written by RDMA writes.", "bytes")
RDMA_WRITE_WORK_REQUEST_ERRORS_TOTAL = _port(
    "rdma_write_wr_err", "fleetscope_efa_rdma_write_work_request_errors_total",
    "RDMA write work requests that completed with an error.")
RDMA_WRITE_RECV_BYTES_TOTAL = _port(
    "rdma_write_recv_bytes", "fleetscope_efa_rdma_write_recv_bytes_total",
    "Bytes received by remote RDMA writes.", "bytes")
RETRANSMIT_BYTES_TOTAL = _port(
    "retrans_bytes", "fleetscope_efa_retransmit_bytes_total", "SRD bytes retransmitted.", "bytes")
RETRANSMIT_PACKETS_TOTAL = _port(
    "retrans_pkts", "fleetscope_efa_retransmit_packets_total", "SRD packets retransmitted.")
RETRANSMIT_TIMEOUT_EVENTS_TOTAL = _port(
    "retrans_timeout_events", "fleetscope_efa_retransmit_timeout_events_total",
    "Times SRD traffic timed out and needed a network path change.")
UNRESPONSIVE_REMOTE_EVENTS_TOTAL = _port(
    "unresponsive_remote_events", "fleetscope_efa_unresponsive_remote_events_total",
    "Times an SRD connection's remote was unresponsive.")
IMPAIRED_REMOTE_CONNECTION_EVENTS_TOTAL = _port(
    "impaired_remote_conn_events", "fleetscope_efa_impaired_remote_connection_events_total",
    "SRD connections that entered an impaired state (reduced rate limit).")

ADMIN_COMMANDS_SUBMITTED_TOTAL = _device(
    "submitted_cmds", "fleetscope_efa_admin_commands_submitted_total",
    "Admin-queue commands submitted to the device.")
ADMIN_COMMANDS_COMPLETED_TOTAL = _device(
    "completed_cmds", "fleetscope_efa_admin_commands_completed_total",
    "Admin-queue commands the device completed.")
ADMIN_COMMAND_ERRORS_TOTAL = _device(
    "cmds_err", "fleetscope_efa_admin_command_errors_total", "Admin-queue commands that failed.")
ADMIN_COMMANDS_NO_COMPLETION_TOTAL = _device(
    "no_completion_cmds", "fleetscope_efa_admin_commands_no_completion_total",
    "Admin-queue commands that never completed (device or admin-queue trouble).")
KEEP_ALIVE_EVENTS_TOTAL = _device(
    "keep_alive_rcvd", "fleetscope_efa_keep_alive_events_total",
    "Keep-alive events received from the device (should keep growing).")

VERBS_OPERATIONS = (
    "alloc_pd", "create_qp", "create_cq", "reg_mr", "alloc_ucontext", "create_ah", "mmap", "alloc_mr", "get_dma_mr",
)
VERBS_ERRORS_TOTAL = MetricSpec(
    "fleetscope_efa_verbs_errors_total", "counter",
    "Failed verbs calls on the device, by operation (alloc_pd, create_qp, create_cq, reg_mr, ...).",
    ("device", "operation"), raw="hw_counters/<operation>_err",
    at_default=AtDefault(("operation",), why="alerts and fabric dashboards read the node"))

PORT_HW_STAT_TOTAL = MetricSpec(
    "fleetscope_efa_port_hw_stat_total", "counter",
    "A port counter this fleetscope version has no curated name for, by its sysfs file name.",
    ("device", "port", "counter"), raw="ports/<n>/hw_counters/<counter>",
    at_default=AtDefault(("counter",), why="alerts and fabric dashboards read the node"))
DEVICE_HW_STAT_TOTAL = MetricSpec(
    "fleetscope_efa_device_hw_stat_total", "counter",
    "A device counter this fleetscope version has no curated name for, by its sysfs file name.",
    ("device", "counter"), raw="hw_counters/<counter>",
    at_default=AtDefault(("counter",), why="alerts and fabric dashboards read the node"))
DEVICES = MetricSpec(
    "fleetscope_efa_devices", "gauge", "EFA devices found on the node (RDMA devices with PCI vendor 0x1d0f).",
    raw="class/infiniband/*/device/vendor")
EXPECTED_DEVICES = MetricSpec(
    "fleetscope_efa_expected_devices", "gauge",
    "EFA devices this node should have (setting efa.expected-count; absent when not configured).")
INFO = MetricSpec(
    "fleetscope_efa_info", "info", "One EFA device: its PCI function, NUMA node and identity.", _DEVICE,
    info_keys=("pci_address", "pci_device_id", "numa_node", "node_guid", "fw_version", "link_layer"))
PORT_RATE_BYTES_PER_SECOND = MetricSpec(
    "fleetscope_efa_port_rate_bytes_per_second", "gauge", "Link rate the port reports.", _PORT,
    unit="bytes/second", raw="ports/<n>/rate",
    at_default=AtDefault((), "sum", why="the node's EFA bandwidth"))

_PORT_COUNTERS = (
    TX_BYTES_TOTAL, TX_PACKETS_TOTAL, RX_BYTES_TOTAL, RX_PACKETS_TOTAL, RX_DROPS_TOTAL,
    SEND_BYTES_TOTAL, SEND_WORK_REQUESTS_TOTAL, RECV_BYTES_TOTAL, RECV_WORK_REQUESTS_TOTAL,
    RDMA_READ_WORK_REQUESTS_TOTAL, RDMA_READ_BYTES_TOTAL, RDMA_READ_WORK_REQUEST_ERRORS_TOTAL,
    RDMA_READ_RESPONSE_BYTES_TOTAL, RDMA_WRITE_WORK_REQUESTS_TOTAL, RDMA_WRITE_BYTES_TOTAL,
    RDMA_WRITE_WORK_REQUEST_ERRORS_TOTAL, RDMA_WRITE_RECV_BYTES_TOTAL,
    RETRANSMIT_BYTES_TOTAL, RETRANSMIT_PACKETS_TOTAL, RETRANSMIT_TIMEOUT_EVENTS_TOTAL,
    UNRESPONSIVE_REMOTE_EVENTS_TOTAL, IMPAIRED_REMOTE_CONNECTION_EVENTS_TOTAL,
)
_DEVICE_COUNTERS = (
    ADMIN_COMMANDS_SUBMITTED_TOTAL, ADMIN_COMMANDS_COMPLETED_TOTAL, ADMIN_COMMAND_ERRORS_TOTAL,
    ADMIN_COMMANDS_NO_COMPLETION_TOTAL, KEEP_ALIVE_EVENTS_TOTAL,
)

TABLE = table(
    "efa",
    "EFA devices (PCI vendor 0x1d0f) from `/sys/class/infiniband`. "
    "Port counters from `ports/<n>/hw_counters/`, device counters from `hw_counters/`. Counters are totals since "
    "the driver loaded and can reset with it. "
    "A counter the driver does not have (SRD counters before EFA driver 2.17) is absent, not 0.",
    [
        *(_file(spec) for spec in _PORT_COUNTERS),
        *(_file(spec) for spec in _DEVICE_COUNTERS),
        *((f"{operation}_err", VERBS_ERRORS_TOTAL) for operation in VERBS_OPERATIONS),
        ("port_counter", PORT_HW_STAT_TOTAL),
        ("device_counter", DEVICE_HW_STAT_TOTAL),
        ("devices", DEVICES),
        ("expected_devices", EXPECTED_DEVICES),
        ("info", INFO),
        ("rate", PORT_RATE_BYTES_PER_SECOND),
    ],
)

# The counter files of each scope that have a curated name.
PORT_COUNTERS = frozenset(_file(spec)[0] for spec in _PORT_COUNTERS)
DEVICE_COUNTERS = frozenset(
    [*(_file(spec)[0] for spec in _DEVICE_COUNTERS), *(f"{op}_err" for op in VERBS_OPERATIONS)]
)
