from __future__ import annotations

from pathlib import Path

import pytest

from fleetscope_sim.kernel_tree import FileTree


@pytest.mark.parametrize("atomic", [True, False])
def test_a_rewritten_file_holds_exactly_the_last_value(tmp_path: Path, atomic: bool) -> None:
    tree = FileTree(str(tmp_path), atomic=atomic)
    for value in (7, 123456789, 42, 42, 1000):  # longer, shorter, the same again, longer
        tree.write("hw_counters/tx_bytes", value)
        assert (tmp_path / "hw_counters" / "tx_bytes").read_text() == f"{value}\n"
    assert sorted(p.name for p in (tmp_path / "hw_counters").iterdir()) == ["tx_bytes"]  # no temporaries left
