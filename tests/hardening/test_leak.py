"""Traced memory and pools flat over create/convert/stack/pickle/drop cycles (LAZYFRAMES_LONG=1)."""

import gc
import os
import pickle
import tracemalloc

import numpy as np

from lazyframes import _core as core

LONG = os.environ.get("LAZYFRAMES_LONG", "") not in ("", "0")
N = 1_000_000 if LONG else 20_000
#: Bytes the cycles after the warm-up may leave allocated: far less than one small object
#: (~50 bytes) per cycle.
MAX_GROWTH = 64 << 10

FRAMES = [np.full((84, 84, 1), v, np.uint8) for v in range(8)]
CHW = [np.full((1, 84, 84), v, np.uint8) for v in range(4)]


def cycle(i, pool, table, out):
    """One cycle of every kind of owner and copy out; the values it read, summed."""
    # baselines-style observations from lists (default pool), the one copy in
    a = core.LazyFrames(FRAMES[i % 4 : i % 4 + 4])
    fresh = FRAMES[0] + np.uint8(i % 7)  # a new array each cycle: a real push
    b = core.LazyFrames([fresh, FRAMES[1], FRAMES[2], fresh])
    # explicit pool: push, lazy, drop the FrameRef; chunks fill and empty
    s = pool.push(FRAMES[i % 8])
    c = pool.lazy([s, s, s, s], layout="last")
    del s
    # the vector stacker's step and the replay table's write: owners replaced each cycle
    rb = pool.push_batch(np.stack([FRAMES[i % 8], FRAMES[(i + 1) % 8]]), k=4)
    rb = rb.shift(np.stack([FRAMES[(i + 2) % 8], FRAMES[(i + 3) % 8]]), [False, True])
    table.set([i % 4], (rb[0:1],))
    t = table.gather([i % 4], 0, 4, layout="stack")
    # conversions out
    x = np.asarray(a)
    a.astype(np.float32, scale=1 / 255)
    core.stack([a, c], out=out, scale=1 / 255)
    z = core.stack([b, c])
    g = pool.gather([list(c.slots)], layout="stack")
    total = int(x[0, 0, 3]) + int(z[1, 0, 0, 0]) + int(g[0, 3, 0, 0, 0]) + int(t[0, 3, 0, 0, 0])
    if i % 64 == 0:  # pickling, shared and separate
        _, b2 = pickle.loads(pickle.dumps([a, b]))
        total += int(np.asarray(b2)[0, 0, 3])
    if i % 16 == 0:  # a channels-first default pool, created and freed each time
        total += int(np.asarray(core.LazyFrames(CHW, layout="first"))[3, 0, 0])
    return total


def expected_checksum(n):
    total = 0
    for i in range(n):
        total += (i % 4) + 3  # x[0, 0, 3]: last frame of FRAMES[i%4 : i%4+4]
        total += 2 * (i % 8)  # z[1, 0, 0, 0] and g[0, 3]: c's frame
        total += (i + 2) % 8  # t[0, 3]: the shifted row's new frame, read back from the table
        total += i % 7 if i % 64 == 0 else 0  # b2's last frame: fresh = 0 + i % 7
        total += 3 if i % 16 == 0 else 0
    return total


def test_memory_flat_over_many_cycles():
    pool = core.FramePool((84, 84, 1), np.uint8, chunk_bytes=16 * 84 * 84)
    table = core.SlotTable(pool, 4, 4)
    out = np.empty((2, 84, 84, 4), np.float32)
    warm = max(N // 10, 1000)
    gc.collect()
    tracemalloc.start()
    try:
        checksum = sum(cycle(i, pool, table, out) for i in range(warm))
        gc.collect()
        held_warm = tracemalloc.get_traced_memory()[0]
        checksum += sum(cycle(i, pool, table, out) for i in range(warm, N))
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - held_warm
    finally:
        tracemalloc.stop()
    assert checksum == expected_checksum(N)  # the cycles really ran
    assert growth < MAX_GROWTH, f"{growth} bytes still allocated after {N - warm} cycles"
    table.clear()
    for p in (pool, core.default_pool((84, 84, 1), np.uint8),
              core.default_pool((1, 84, 84), np.uint8)):  # fmt: skip
        assert p.live_frames == 0, p.stats()
    assert pool.bytes_held <= 16 * 84 * 84  # one spare chunk at most
