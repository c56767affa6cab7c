"""The client's seams (#28 item 3), read from the source: hooks time through the tracker's public timeline,
import no private name, and the client imports nothing of fleetscope but itself and the wire contract."""

from __future__ import annotations

import ast
from pathlib import Path

import fleetscope

PACKAGE = Path(fleetscope.__file__).parent
CLIENT = PACKAGE / "client"
OWNERS = {CLIENT / "timeline.py", CLIENT / "tracker.py"}  # where the tracker's and timeline's insides live
TIMING_OBJECTS = {"tracker", "timeline"}  # names a hook holds the tracker or its timeline by


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def fleetscope_imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fleetscope":
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == "fleetscope"]
    return found


def held_by(node: ast.expr) -> str | None:
    """The name an attribute chain ends in: ``self.timing.tracker`` -> ``tracker``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def private_touches(tree: ast.Module) -> list[ast.Attribute]:
    """``tracker._x`` / ``timeline._x`` (dunders aside) anywhere in ``tree``."""
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and held_by(node.value) in TIMING_OBJECTS]


def test_no_module_outside_the_tracker_touches_its_insides() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {held_by(node.value)}.{node.attr}"
        for path in sorted(PACKAGE.rglob("*.py")) if path not in OWNERS
        for node in private_touches(parsed(path))
    ]
    assert offenders == []


def test_the_check_above_sees_a_private_touch() -> None:
    tree = ast.parse("tracker._position = (1, 'comm', 0.0)\nself.timing.tracker.timeline._depth += 1\n")
    assert sorted(node.attr for node in private_touches(tree)) == ["_depth", "_position"]


def test_no_client_module_imports_a_private_name() -> None:
    offenders = [
        f"{path.name}: from {module} import {name}"
        for path in sorted(CLIENT.glob("*.py"))
        for module, names in fleetscope_imports(parsed(path))
        for name in names
        if name.startswith("_")
    ]
    assert offenders == []


def test_the_client_imports_only_itself_and_the_wire_contract() -> None:
    allowed = ("fleetscope.client", "fleetscope.wire")
    for path in sorted(CLIENT.glob("*.py")):
        for module, names in fleetscope_imports(parsed(path)):
            targets = [f"{module}.{name}" for name in names] if module == "fleetscope" else [module]
            for target in targets:
                assert target.startswith(allowed), f"{path.name} imports {target}"
    assert fleetscope_imports(parsed(PACKAGE / "wire.py")) == []  # the contract stands on nothing of ours
