"""Side-by-side benchmarks of lazyframes against its peers (run them all: ``python -m lazyframes bench``).

Each module has ``main(argv=None)`` that prints one table with ratios against peers
measured in the same run and returns its rows (a list of dicts):

- ``bench_core``: materialising observations and batches (core, ``lazyframes.stack``)
  against a baselines-style LazyFrames, ``np.array(list)`` and the copy floor.
- ``bench_wrappers``: per-step stacking overhead against Gymnasium's
  FrameStackObservation, baselines' FrameStack and SB3's VecFrameStack.
- ``bench_replay``: bytes per transition, ``add`` and ``sample`` against SB3, cpprb,
  a naive buffer and the gather floor.
"""
