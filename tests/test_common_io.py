"""Write-then-rename: a failure leaves the old content and no temporary; success replaces it whole."""

import pytest

from electra_ablate.common import io


def test_atomic_file_keeps_the_old_content_on_failure_and_cleans_up(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    io.write_text(path, "old")
    with pytest.raises(RuntimeError):
        with io.atomic_file(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert path.read_text() == "old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.txt"]
    io.write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_atomic_dir_replaces_or_keeps_the_first_copy(tmp_path):
    target = tmp_path / "d"
    with io.atomic_dir(target) as tmp:
        (tmp / "x").write_text("1")
    with pytest.raises(ValueError):
        with io.atomic_dir(target) as tmp:
            (tmp / "x").write_text("2")
            raise ValueError
    assert (target / "x").read_text() == "1"
    with io.atomic_dir(target) as tmp:
        (tmp / "x").write_text("3")
    assert (target / "x").read_text() == "3"
    with io.atomic_dir(target, replace=False) as tmp:  # a cache entry someone else finished first is kept
        (tmp / "x").write_text("4")
    assert (target / "x").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
