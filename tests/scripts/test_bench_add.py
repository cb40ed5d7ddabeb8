"""bench/bench_add.py and its C floor ``lazyframes._core._ingest_floor``."""

import statistics

import numpy as np
import pytest
from conftest import refused

from lazyframes import _core


def _streams(E, k, steps, frame=(3, 5), seed=0):
    """``steps`` stacks ``(E, k, *frame)``: env e's stack t is frames t .. t+k-1 of its stream."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (E, steps + k, *frame), dtype=np.uint8)
    return [np.ascontiguousarray(frames[:, t : t + k]) for t in range(steps)]


@pytest.mark.parametrize("E", [1, 3])
def test_ingest_floor_stores_each_stack_with_one_new_frame(E):
    k, steps = 4, 6
    stacks = _streams(E, k, steps)
    if E == 1:
        stacks = [s[0] for s in stacks]  # (k, *frame), as one env gives them
    prev = np.full((E, k), -1, np.int64)
    arena = np.zeros((64, 3, 5), np.uint8)
    pos = _core._ingest_floor(stacks[:1], prev, arena)
    assert pos == E * k  # the first stack: every frame
    pos = _core._ingest_floor(stacks[1:], prev, arena, pos)
    assert pos == E * k + (steps - 1) * E  # then one new frame per env and step
    last = stacks[-1].reshape(E, k, 3, 5)
    for e in range(E):
        np.testing.assert_array_equal(arena[prev[e]], last[e])


def test_ingest_floor_copies_every_frame_of_a_new_episode_and_wraps():
    k = 4
    a, b = _streams(1, k, 1, seed=1)[0], _streams(1, k, 1, seed=2)[0]
    prev = np.full((1, k), -1, np.int64)
    arena = np.zeros((6, 3, 5), np.uint8)
    pos = _core._ingest_floor([a, b], prev, arena, 0)
    assert pos == (2 * k) % 6
    np.testing.assert_array_equal(arena[prev[0]], b[0])


class _Sub(np.ndarray):
    pass


def test_ingest_floor_refuses_wrong_calls():
    f = _core._ingest_floor
    stacks = _streams(2, 4, 2)
    prev = np.full((2, 4), -1, np.int64)
    arena = np.zeros((16, 3, 5), np.uint8)
    ro = arena.copy()
    ro.setflags(write=False)
    cases = [
        (TypeError, lambda: f(stacks, prev.astype(np.int32), arena)),
        (TypeError, lambda: f(stacks, prev, arena.astype(np.int16))),
        (TypeError, lambda: f([list(stacks[0])], prev, arena)),
        (TypeError, lambda: f(stacks, prev, arena.view(_Sub))),  # plain ndarrays only
        (TypeError, lambda: f([stacks[0].view(_Sub)], prev, arena)),
        (TypeError, lambda: f(5, prev, arena)),
        (ValueError, lambda: f(stacks, prev, arena[:, :, ::2])),
        (ValueError, lambda: f(stacks, prev, ro)),
        (ValueError, lambda: f(stacks, prev, arena, 16)),
        (ValueError, lambda: f(stacks, prev, arena, -1)),
        (ValueError, lambda: f(stacks, prev, arena[:3])),
        (ValueError, lambda: f(stacks, prev, arena[:0])),
        (ValueError, lambda: f(stacks, prev[0], arena)),
        (ValueError, lambda: f([stacks[0][:1]], prev, arena)),
        (ValueError, lambda: f(stacks, np.full((2, 4), 16, np.int64), arena)),
        (ValueError, lambda: f([arena.reshape(-1)[: 2 * 4 * 15]], prev, arena)),
        (ValueError, lambda: f(stacks, arena.reshape(-1)[:64].view(np.int64).reshape(2, 4), arena)),
    ]
    before = arena.copy()
    for exc, call in cases:
        refused(exc, "", call)
    np.testing.assert_array_equal(arena, before)  # nothing written by a refused call
    assert (prev == -1).all()


# -- bench_add: the table, for this checkout only (no venv), and the ratios ------------------
ADD_CASES = ["add_lazybatch_8", "add_lazyframes_1", "add_ndarray_1", "add_ndarray_8"]
ALL_CASES = [*ADD_CASES, "sample_32", "prioritized_32"]


def test_bench_add_quick_for_this_checkout(capsys):
    from bench import bench_add

    argv = ["--quick", "--revisions", "ours", "--capacity", "1000", "--blocks", "2"]
    rows = bench_add.main([*argv, "--block", "64", "--block-calls", "4"])
    text = capsys.readouterr().out
    assert [r["name"] for r in rows] == ALL_CASES
    assert "bench_add: lazyframes" in text and "measured on" in text  # versions, CPU, date
    for r in rows:
        assert r["case"] in text
        blocks = r["blocks"]["ours"]
        assert len(blocks["lf"]) == 2  # one figure per block, two blocks
        assert r["ours_us"] == statistics.median(blocks["lf"]) > 0
        assert "ours_vs_0.1" not in r and "ours_vs_0.2" not in r  # not asked for
    by = {r["name"]: r for r in rows}
    for name, factor in (("add_lazybatch_8", 1.0), ("add_lazyframes_1", 4.0)):
        r = by[name]
        assert r["floor_us"] is None
        assert r["baselines_us"] == statistics.median(r["blocks"]["ours"]["baselines"])
        assert r["ours_vs_baselines"] == pytest.approx(r["ours_us"] / r["baselines_us"])
        assert r["target_us"] == pytest.approx(factor * r["baselines_us"])
        assert r["ours_vs_target"] == pytest.approx(r["ours_us"] / r["target_us"])
    for name, lazy in (("add_ndarray_1", "add_lazyframes_1"), ("add_ndarray_8", "add_lazybatch_8")):
        r = by[name]
        assert r["baselines_us"] is None
        assert r["floor_us"] == statistics.median(r["blocks"]["ours"]["floor"])
        assert r["target_us"] == pytest.approx(by[lazy]["target_us"] + 2 * r["floor_us"])
        assert r["ours_vs_target"] == pytest.approx(r["ours_us"] / r["target_us"])
    for name in ("sample_32", "prioritized_32"):
        assert by[name]["unit"] == "us/call" and by[name]["target_us"] is None


def test_bench_add_ratios_come_from_the_figures():
    from bench import bench_add

    labels = ["0.1", "0.2", "ours"]
    times = {  # per block: {case: {revision: {variant: [figures]}}}
        "add_lazybatch_8": {"0.1": {"lf": [0.2, 0.3, 0.25]}, "0.2": {"lf": [1.2, 1.4, 1.3]},
                            "ours": {"lf": [0.2, 0.24, 0.22], "baselines": [0.2, 0.3, 0.25]}},
        "add_lazyframes_1": {"0.1": {"lf": [1.0]}, "0.2": {"lf": [2.4]},
                             "ours": {"lf": [1.1], "baselines": [0.25]}},
        "add_ndarray_1": {"0.1": {"lf": [4.0]}, "0.2": {"lf": [5.0]},
                          "ours": {"lf": [3.0], "floor": [1.0]}},
        "add_ndarray_8": {"0.1": {"lf": [2.0]}, "0.2": {"lf": [3.0]},
                          "ours": {"lf": [2.5], "floor": [0.5]}},
        "sample_32": {"0.1": {"lf": [90.0]}, "0.2": {"lf": [100.0]}, "ours": {"lf": [103.0]}},
        "prioritized_32": {"0.2": {"lf": [120.0]}, "ours": {"lf": [130.0]}},
    }  # fmt: skip
    notes = {None: {}, "prioritized_32": {"0.1": "no PrioritizedReplayBuffer in this revision"}}
    rows = bench_add.rows_of(times, notes, labels, bench_add.CASES)
    by = {r["name"]: r for r in rows}
    r = by["add_lazybatch_8"]
    assert (r["0.1_us"], r["0.2_us"], r["ours_us"], r["baselines_us"]) == (0.25, 1.3, 0.22, 0.25)
    assert r["ours_vs_0.1"] == pytest.approx(0.22 / 0.25)
    assert r["ours_vs_0.2"] == pytest.approx(0.22 / 1.3)  # (baselines, targets: the quick run)
    p = by["prioritized_32"]
    assert p["0.1_us"] is None and p["ours_vs_0.1"] is None
    assert "0.1: no PrioritizedReplayBuffer" in p["note"]
    assert p["ours_vs_0.2"] == pytest.approx(130 / 120)

    results = dict(bench_add.check_targets(rows, labels))
    met = {text.rsplit(": ", 1)[0]: ok for text, ok in results.items()}  # what: value (target)
    assert met["add: 8 envs LazyBatch: ours / 0.1"] is True  # 0.88x <= 1
    assert met["add: 8 envs LazyBatch: ours / the baselines restatement"] is True
    assert met["add: 1 env LazyFrames: ours / 0.1"] is False  # 1.1x
    assert met["add: 1 env LazyFrames: ours / the baselines restatement"] is False  # 4.4x > 4
    ndarray_8 = "add: 8 envs ndarray (8, 4, 84, 84): ours / (lazy 8-env target + 2x C floor"
    assert met[f"{ndarray_8} = 1.25 us)"] is False
    assert met["sample(32, out=) uint8: ours / 0.2 (target 1x, noise allowed)"] is True  # 1.03x
    assert met["prioritized sample(32) + update: ours / 0.2 (target 1x, noise allowed)"] is False
    table = bench_add.format_table(rows, bench_add.columns(labels))
    assert "0.88x" in table and "1.03x" in table and "check: 1.05x" in table

    # without 0.1 and 0.2, no target names them
    texts = [t for t, _ in bench_add.check_targets(rows, ["ours"])]
    assert texts and not any("0.1" in t or "0.2" in t for t in texts)


def test_bench_add_revisions():
    from bench import bench_add

    expected = [("0.1", bench_add.REVISIONS["0.1"]), ("ours", None), ("x", "abc123")]
    assert bench_add.resolve(["0.1", "ours", "x=abc123"]) == expected
    refused(ValueError, "unknown revision", bench_add.resolve, ["0.3", "ours"])
    refused(ValueError, "must include 'ours'", bench_add.resolve, ["0.1"])
    refused(SystemExit, "", bench_add.main, ["--revisions", "0.1"])


def test_shared_table_and_checks(capsys):
    from bench import _util

    text = _util.format_table(
        [{"a": "x", "b": None, "c": 1.5}, {"a": "yy", "b": 2.0, "c": float("nan")}],
        [("a", "A", "{}"), ("b", "B", "{:.1f}"), ("c", "C", "{:.2f}x")],
    )
    assert text.splitlines() == [
        "A     B      C",
        "--  ---  -----",
        "x     -  1.50x",
        "yy  2.0      -",
    ]
    assert _util.target("t", 1.0, "<=", 1.05) == ("t: 1.00x (target <= 1.05x)", True)
    assert _util.target("t", None, "<=", 1.0) == ("t: not measured (target <= 1.00x)", False)
    assert _util.report_checks([("a", True)])
    with pytest.raises(SystemExit) as e:
        _util.report_checks([("a", True), ("b", False)])
    assert e.value.code == 1
    assert capsys.readouterr().out.splitlines()[-1] == "check b: MISSED"


def test_codec_floor_encodes_keyframes_and_patches_as_the_pool():
    frames = np.zeros((9, 84, 84), np.uint8)
    frames[np.arange(9), 0, np.arange(9)] = 1  # frame i: a 1 in column i
    fb = frames[0].nbytes
    key = _core._codec_floor(frames[:1], group=1)  # a keyframe of zeros: the codec's blob
    assert 0 < key < 100
    assert _core._codec_floor(frames[:1], group=4) == fb  # the first keyframe: a root, raw
    # the root 0; 1, 2, 3 patched against 0, 1, 2 (a run of 2 bytes each); keyframes 4 and
    # 8 patched against the root (smaller than the codec's blob); 5, 6, 7 against 4, 5, 6
    total = _core._codec_floor(frames, group=4)
    run = _core._codec_floor(frames[:2], group=4) - fb
    key4, key8 = (_core._codec_floor(frames[[0, i]], group=4) - fb for i in (4, 8))
    assert 3 < run < 10 and total == fb + 6 * run + key4 + key8
    assert _core._codec_floor(frames, group=1) == sum(
        _core._codec_floor(frames[i : i + 1], group=1) for i in range(9)
    )
    # a frame equal to one of the 4 before it is an alias: no bytes; from further back, a patch
    a, b = frames[0], frames[1]
    assert _core._codec_floor(np.stack([a, b, a, b, a]), group=8) == fb + run
    assert _core._codec_floor(frames[[0, 1, 2, 3, 4, 0]], group=8) > _core._codec_floor(
        frames[:5], group=8
    )
    # a root every LF_ROOT_FRAMES (8,192) frames: 128 keyframes of a group of 64
    small = np.zeros((8192 + 64, 4, 4), np.uint8)
    small.reshape(-1, 16)[:, :4] = np.arange(len(small), dtype="<u4")[:, None].view(np.uint8)
    floor = _core._codec_floor
    assert floor(small, group=64) == floor(small[:8192], group=64) + floor(small[8192:], group=64)
    refused(TypeError, "uint8", _core._codec_floor, frames.astype(np.float32))
    refused(ValueError, "n >= 1", _core._codec_floor, frames[:0])


def test_bench_compress_checks_its_targets_on_the_four_games_only(capsys):
    """Any ALE game may be measured; the bytes and sampling targets are the four games'."""
    from bench import bench_compress

    row = {"buffer": "ours compress", "cost_vs_codec": 1.0, "add_us": 9.0, "bpt_rss": 300.0,
           "bpt_own": 290.0, "u8_vs_ours": 2.5, "f32_vs_ours": 2.0}  # fmt: skip
    assert not bench_compress.check([{**row, "game": "Pong"}])  # 300 B and 2.5x: missed
    out = capsys.readouterr().out
    assert "Pong B/transition by RSS: 300 (<= 250: MISSED)" in out and "u8 vs ours" in out
    assert bench_compress.check([{**row, "game": "SpaceInvaders"}])
    out = capsys.readouterr().out
    assert "add per new frame" in out and "B/transition" not in out and "vs ours" not in out
