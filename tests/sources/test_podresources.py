"""The kubelet pod-resources reader against grpcio's real server on a unix socket."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleetscope.errors import SourceError
from fleetscope.sources import podresources
from fleetscope.sources.podresources import Allocation
from tests.kubelet import kubelet, response

PODS = [
    {"name": "llama-0", "namespace": "train", "containers": [
        {"name": "trainer", "devices": [("nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"]),
                                        ("vpc.amazonaws.com/efa", ["0"])]},
        {"name": "sidecar", "devices": []},
    ]},
    {"name": "notebook", "namespace": "research", "containers": [
        {"name": "jupyter", "devices": [("nvidia.com/mig-1g.10gb", ["MIG-cccc"])]},
    ]},
]


def test_lists_every_gpu_and_mig_device_of_every_container_and_nothing_else(tmp_path) -> None:
    socket = str(tmp_path / "kubelet.sock")
    with kubelet(socket, response(PODS)) as requests:
        got = podresources.read(socket, timeout=240)
    assert len(requests) == 1
    assert got == (
        Allocation("llama-0", "train", "trainer", "nvidia.com/gpu", "GPU-aaaa"),
        Allocation("llama-0", "train", "trainer", "nvidia.com/gpu", "GPU-bbbb"),
        Allocation("notebook", "research", "jupyter", "nvidia.com/mig-1g.10gb", "MIG-cccc"),
    )


def test_an_empty_node_has_no_allocations(tmp_path) -> None:
    socket = str(tmp_path / "kubelet.sock")
    with kubelet(socket, response([])):
        assert podresources.read(socket, timeout=240) == ()


def test_an_absent_socket_is_a_one_line_source_error(tmp_path) -> None:
    socket = str(tmp_path / "absent.sock")
    with pytest.raises(SourceError) as caught:
        podresources.read(socket, timeout=1)
    message = str(caught.value)
    assert message.startswith(f"kubelet pod-resources {socket}: UNAVAILABLE") and "\n" not in message


def test_without_the_extra_the_error_names_it() -> None:
    # A fresh interpreter where grpc cannot be imported: the reader says which extra brings it, in one line.
    code = ("import sys; sys.modules['grpc'] = None\n"
            "from fleetscope.sources import podresources\n"
            "try:\n    podresources.read('/nonexistent.sock', 1)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == f"SourceError {podresources.EXTRA_HINT}\n"
    assert "pip install 'fleetscope[kubelet]'" in out
