"""Memory stays flat over many create / convert / stack / pickle / drop cycles.

Each core runs in a fresh subprocess that measures its own resident set size (RSS,
from /proc/self/statm) after a warm-up and at the end: growth must stay below a few MB
and the pools must hold zero live frames once every owner (FrameRef, LazyFrames,
LazyBatch, SlotTable rows) is dropped. N cycles is
1,000,000 with LAZYFRAMES_LONG=1, else 50,000 (for the compiled core; the NumPy twin,
about ten times slower per cycle, runs an eighth of that).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from conftest import IMPLS, MODULES

ROOT = pathlib.Path(__file__).resolve().parent.parent
LONG = os.environ.get("LAZYFRAMES_LONG", "") not in ("", "0")
N = 1_000_000 if LONG else 50_000
MAX_GROWTH = 4 << 20  # bytes

SCRIPT = textwrap.dedent(r"""
    import gc, importlib, json, os, pickle, sys
    import numpy as np
    core = importlib.import_module(sys.argv[1])
    n = int(sys.argv[2])
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * page

    frames = [np.full((84, 84, 1), v, np.uint8) for v in range(8)]
    chw = [np.full((1, 84, 84), v, np.uint8) for v in range(4)]
    pool = core.FramePool((84, 84, 1), np.uint8, chunk_bytes=16 * 84 * 84)
    out = np.empty((2, 84, 84, 4), np.float32)
    dpool = core.default_pool((84, 84, 1), np.uint8)
    table = core.SlotTable(pool, 4, 4)
    checksum = 0
    warm = max(n // 10, 1000)
    for i in range(n):
        # baselines-style observations from lists (default pool), the one copy in
        a = core.LazyFrames(frames[i % 4:i % 4 + 4])
        fresh = frames[0] + np.uint8(i % 7)  # a new array each cycle: a real push
        b = core.LazyFrames([fresh, frames[1], frames[2], fresh])
        # explicit pool: push, lazy, drop the FrameRef; chunks fill and empty
        s = pool.push(frames[i % 8])
        c = pool.lazy([s, s, s, s], layout="last")
        del s
        # the vector stacker's step and the replay table's write: owners replaced each cycle
        rb = pool.push_batch(np.stack([frames[i % 8], frames[(i + 1) % 8]]), k=4)
        rb = rb.shift(np.stack([frames[(i + 2) % 8], frames[(i + 3) % 8]]), [False, True])
        table.set([i % 4], (rb[0:1],))
        t = table.gather([i % 4], 0, 4, layout="stack")
        # conversions out
        x = np.asarray(a)
        y = a.astype(np.float32, scale=1 / 255)
        core.stack([a, c], out=out, scale=1 / 255)
        z = core.stack([b, c])
        g = pool.gather([list(c.slots)], layout="stack")
        checksum += int(x[0, 0, 3]) + int(z[1, 0, 0, 0]) + int(g[0, 3, 0, 0, 0])
        checksum += int(t[0, 3, 0, 0, 0])
        # pickling, shared and separate
        if i % 64 == 0:
            a2, b2 = pickle.loads(pickle.dumps([a, b]))
            checksum += int(np.asarray(b2)[0, 0, 3])
            del a2, b2
        # channels-first observation whose default pool is created and freed each time
        if i % 16 == 0:
            d = core.LazyFrames(chw, layout="first")
            checksum += int(np.asarray(d)[3, 0, 0])
            del d
        del a, b, c, x, y, z, g, t, rb, fresh
        if i == warm:
            gc.collect()
            rss_warm = rss()
    table.clear()
    gc.collect()
    rss_end = rss()
    print(json.dumps({
        "rss_warm": rss_warm, "rss_end": rss_end, "checksum": checksum,
        "pool_live": pool.live_frames, "pool_held": pool.bytes_held,
        "default_live": dpool.live_frames,
        "chw_live": core.default_pool((1, 84, 84), np.uint8).live_frames,
    }))
""")


def expected_checksum(n):
    total = 0
    for i in range(n):
        total += (i % 4) + 3  # x[0, 0, 3]: last frame of frames[i%4 : i%4+4]
        total += i % 8  # z[1, 0, 0, 0]: c's frame
        total += i % 8  # g[0, 3]: c's last frame
        total += (i + 2) % 8  # t[0, 3]: the shifted row's new frame, read back from the table
        if i % 64 == 0:
            total += i % 7  # b2's last frame: fresh = 0 + i % 7
        if i % 16 == 0:
            total += 3
    return total


@pytest.mark.parametrize("name", IMPLS)
def test_memory_flat_over_many_cycles(name):
    n = N if name == "compiled" else N // 8  # the twin is ~10x slower per cycle
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, MODULES[name], str(n)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=3600,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["checksum"] == expected_checksum(n)  # the cycles really ran
    assert res["pool_live"] == 0 and res["default_live"] == 0 and res["chw_live"] == 0, res
    if name == "compiled":  # the twin need not mirror the arena's chunks
        assert res["pool_held"] <= 16 * 84 * 84  # one spare chunk at most
    growth = res["rss_end"] - res["rss_warm"]
    assert growth < MAX_GROWTH, f"RSS grew by {growth / 2**20:.1f} MiB over {n} cycles: {res}"
