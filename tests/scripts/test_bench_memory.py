"""bench/bench_memory.py: the split of a compressed transition's bytes, on a short recording."""

import pytest


def test_bench_memory_splits_the_bytes_and_sets_the_floors(tmp_path):
    from bench import bench_memory  # its floors need zstandard (the test and bench extras)

    (row,) = bench_memory.main(["--games", "Pong", "--steps", "300", "--cache", str(tmp_path)])
    assert row["steps"] == 300 and (tmp_path / "Pong-v5-steps300-seed0.npz").is_file()
    assert sum(row[k] for k in ("payload", "slot_state", "tables")) == pytest.approx(row["memory"])
    assert row["slot_state"] > 0 < row["floor_xor"] < row["floor_frame"] < 7056  # deltas pay
    assert row["bound"] == pytest.approx(1.5 * row["floor_xor"] + 24)
    texts = [t for t, _ in bench_memory.check_targets([row])]
    assert len(texts) == 5 and "target <= 150.0 B" in texts[0]
