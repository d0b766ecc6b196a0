"""A process's descriptor table read through one open of its fd directory (issue 41's idle cost): the same
targets as one confined readlink a descriptor, never followed, never outside the root."""

from __future__ import annotations

import os

from gpuwarden.facts.memory import _fd_links
from gpuwarden.root import HostRoot, Missing


def tree(tmp_path):
    fd = tmp_path / "proc/123/fd"
    fd.mkdir(parents=True)
    for name, target in (("0", "/dev/null"), ("3", "/dev/nvidia0"), ("10", "/dev/nvidiactl"),
                         ("4", "../../../../etc/passwd"), ("x", "/dev/nvidia1")):
        os.symlink(target, fd / name)
    (tmp_path / "proc/124").mkdir()
    os.symlink("/etc", tmp_path / "proc/124/fd")  # a table that is a link out of the root
    return HostRoot(str(tmp_path))


def test_readlinks_equals_one_readlink_a_name(tmp_path):
    root = tree(tmp_path)
    got = root.readlinks("/proc/123/fd")
    assert got == {n: root.readlink(f"/proc/123/fd/{n}") for n in root.listdir("/proc/123/fd")}
    assert got["4"] == "../../../../etc/passwd"  # read, not followed


def test_readlinks_reads_only_the_chosen_names(tmp_path):
    root = tree(tmp_path)
    assert root.readlinks("/proc/123/fd", lambda names: ["3", "nope"]) == {"3": "/dev/nvidia0"}


def test_a_table_linked_out_of_the_root_is_not_read(tmp_path):
    root = tree(tmp_path)
    # "/etc" is resolved inside the root (where there is none), never the host's /etc
    assert isinstance(root.readlinks("/proc/124/fd"), Missing) and isinstance(root.listdir("/proc/124/fd"), Missing)


class PerLink:
    """A root without readlinks (a bundle): the one-by-one path."""

    def __init__(self, root):
        self.root = root

    def listdir(self, p):
        return self.root.listdir(p)

    def readlink(self, p):
        return self.root.readlink(p)


def test_fd_links_is_the_same_either_way_and_keeps_the_first_descriptors(tmp_path):
    root = tree(tmp_path)
    cut_a, cut_b = [], []
    a = _fd_links(root, 123, 3, cut_a)
    b = _fd_links(PerLink(root), 123, 3, cut_b)
    assert a == b == ["/dev/null", "/dev/nvidia0", "../../../../etc/passwd"]  # fds 0, 3, 4 (decimal names only)
    assert cut_a == cut_b == ["pid 123: only the first 3 of 4 descriptors read"]
    assert isinstance(_fd_links(root, 999, 3, []), Missing)
