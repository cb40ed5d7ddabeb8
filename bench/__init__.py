"""Side-by-side benchmarks of lazyframes against its peers and floors.

Run them all with ``python -m bench`` from the root of the clone (``bench/__main__.py``).

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

Run alone (not by ``python -m bench``): ``bench_add`` (``ReplayBuffer.add``
of this checkout against lazyframes 0.1 and 0.2, built once in
``~/.cache/lazyframes-bench``, the baselines restatement and a C floor, the revisions
in processes taking turns), ``bench_prioritized``,
``bench_distributed`` and ``bench_serve``. ``_util`` holds what they share (tables, the header line,
round-robin timing, the ``--check`` report).

bench/README.md explains the floors and the developer targets (``--check``).
"""
