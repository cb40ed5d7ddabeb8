"""examples/apex_ray.py --smoke on a local Ray: its figures' values (never timings)."""

import re

import ray  # noqa: F401  (the distributed extra: the example needs it)
from conftest import ROOT, run_ok


def figures(out: str) -> dict:
    line = [x for x in out.splitlines() if x.startswith("apex_ray: ")]
    assert len(line) == 1, out
    return dict(re.findall(r"(\w+)=(\S+)", line[0]))


def test_apex_ray_smoke_ingests_every_transition_at_a_fraction_of_the_bytes(tmp_path):
    f = figures(run_ok(f"{ROOT}/examples/apex_ray.py", "--smoke", "--prioritized", cwd=tmp_path))
    # 2 actors x 2 envs x 2 rounds x 150 vector steps, every one ingested
    assert int(f["transitions"]) == 1200 and int(f["learner_steps"]) == 20
    assert float(f["ingest_per_s"]) > 0 and float(f["replay_ingest_per_s"]) > 0
    # an obs + next_obs pair: 56,448 bytes; a message: a compressed frame + ~30 B a transition
    naive, wire = float(f["naive_bytes_per_transition"]), float(f["wire_bytes_per_transition"])
    assert 56_448 <= naive < 57_000 and float(f["sample_us"]) > 0
    assert f["prioritized"] == "True"
    cold, stored = float(f["cold_bytes_per_frame"]), float(f["replay_bytes_per_transition"])
    assert 0 < wire < 1_000 and float(f["wire_ratio"]) > 50
    assert 0 < cold < 1_500  # the replay's compressed frames
    assert 0 < stored < 7_056
