"""The worker cgroups' files on both cgroup versions, against a fake cgroup tree.

The real kernel paths run in tests/security (test_noisy_neighbour, test_corpus); this host has
cgroup v1, so the v2 layout (one directory per worker holding memory, pids and cpu files) is
checked here for what the code writes and reads back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.sandbox import cgroups


@pytest.fixture
def v2_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "_own_v2_path", lambda: "/")
    return tmp_path


@pytest.fixture
def v1_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for controller in ("memory", "pids", "cpu"):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "tasks").write_text("")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    return tmp_path


def test_v2_worker_gets_one_cpu_in_its_own_group(v2_tree: Path) -> None:
    assert cgroups.cpu_available()
    group = cgroups.WorkerGroup.create("cascade-sbx-1-2-0")
    assert group.v2 and group.cpu_dir == group.memory_dir == v2_tree / "cascade-sbx-1-2-0"
    assert (group.cpu_dir / "cpu.max").read_text() == "100000 100000"
    assert group.cpu_limit() == 1.0
    assert group.dirs() == [group.memory_dir]  # the worker joins one directory
    group.set_cpus(0.5)
    assert (group.cpu_dir / "cpu.max").read_text() == "50000 100000" and group.cpu_limit() == 0.5
    (group.cpu_dir / "cpu.max").write_text("max 100000")
    assert group.cpu_limit() is None


def test_v2_without_the_cpu_controller_is_unbounded(v2_tree: Path) -> None:
    (v2_tree / "cgroup.controllers").write_text("memory pids\n")
    (v2_tree / "cgroup.subtree_control").write_text("memory pids\n")
    assert cgroups.available() and not cgroups.cpu_available()
    group = cgroups.WorkerGroup.create("cascade-sbx-1-2-0")
    assert group.cpu_dir is None and group.cpu_limit() is None
    with pytest.raises(OSError, match="no CPU group"):
        group.set_cpus(1.0)


def test_v1_worker_gets_a_cpu_group_beside_memory_and_pids(v1_tree: Path) -> None:
    assert cgroups.cpu_available()
    group = cgroups.WorkerGroup.create("cascade-sbx-1-2-0", cpus=2.0)
    assert not group.v2 and group.cpu_dir == v1_tree / "cpu" / "cascade-sbx-1-2-0"
    assert (group.cpu_dir / "cpu.cfs_period_us").read_text() == "100000"
    assert (group.cpu_dir / "cpu.cfs_quota_us").read_text() == "200000"
    assert group.cpu_limit() == 2.0
    assert group.dirs() == sorted([group.cpu_dir, group.memory_dir, group.pids_dir])


def test_no_cpu_group_when_asked_for_none(v1_tree: Path) -> None:
    group = cgroups.WorkerGroup.create("cascade-sbx-1-2-0", cpus=None)
    assert group.cpu_dir is None and not (v1_tree / "cpu" / "cascade-sbx-1-2-0").exists()
