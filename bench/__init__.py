"""Side-by-side benchmarks of lazyframes against its peers and floors.

Run them all with ``python -m lazyframes bench``.

Each module has ``main(argv=None)`` that prints one table with ratios against peers
and floors measured in the same run and returns its rows (a list of dicts):

- ``bench_core``: materialising observations and batches (core, ``lazyframes.stack``)
  against the copy floor, the gather floor (a plain C ``memcpy`` loop over the same
  frames), a baselines-style LazyFrames and ``np.array(list)``.
- ``bench_wrappers``: per-step stacking overhead against Gymnasium's
  FrameStackObservation, baselines' FrameStack and SB3's VecFrameStack.
- ``bench_replay``: bytes per transition, ``add`` and ``sample`` against SB3, cpprb,
  a naive buffer and the gather floor.
- ``bench_sb3``: SB3 replay buffers on real Breakout frames (RSS and data per
  transition, ``add``, ``sample``): SB3's default and memory-optimised buffers,
  sb3-extra-buffers' zstd buffer and ``lazyframes.sb3.ReplayBuffer``.
- ``bench_compress``: ``ReplayBuffer(..., compress=True)`` on recorded real Atari frames
  against our uncompressed buffer and sb3-extra-buffers zstd-3.

bench/README.md explains the floors and the developer targets (``--check``).
"""
