"""The checkout's commands, run from the root as the README says: examples/demo.py, -m bench."""

import importlib.util
import json
import re
from pathlib import Path

import matplotlib  # noqa: F401  (the demo's --plot needs it: part of the test extra)
import pytest
import tqdm  # noqa: F401  (the demo's progress bar)
from conftest import ROOT, assert_one_line_error, run, run_guarded

CHECKOUT = Path(ROOT)
DEMO = "examples/demo.py"  # relative: the commands run from the root of the checkout
INSTALL_DEMO = "python -m pip install -e '.[demo]'"


@pytest.fixture(scope="module")
def demo():
    """examples/demo.py as a module (a script: importing it runs nothing)."""
    spec = importlib.util.spec_from_file_location("examples_demo", CHECKOUT / DEMO)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_package_has_no_command_line():
    assert not (CHECKOUT / "lazyframes" / "__main__.py").exists()
    assert not (CHECKOUT / "lazyframes" / "demo.py").exists()
    # files, not ``python -m lazyframes``: another checkout's editable install would find one
    assert "[project.scripts]" not in (CHECKOUT / "pyproject.toml").read_text()


def test_version_is_lazyframes_dunder_version():
    r = run("-c", "import lazyframes; print(lazyframes.__version__)")
    assert r.returncode == 0, r.stderr
    version = re.search(r'^version = "(.+)"$', (CHECKOUT / "pyproject.toml").read_text(), re.M)
    assert r.stdout == version.group(1) + "\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*\n", r.stdout)


def test_demo_help_explains_every_option():
    r = run(DEMO, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: demo.py ")
    opts = "--env --steps --num-envs --capacity --batch-size --seed --plot --json --stack-size"
    for opt in [*opts.split(), "--train-freq", "--compress", "--no-compress", "--no-progress"]:
        assert opt in r.stdout, opt
    assert "ALE/Pong-v5" in r.stdout


def test_demo_compress_flags(demo):
    """--compress / --no-compress set the option; without either, the demo's default."""
    parser = demo.build_parser()
    assert parser.parse_args([]).compress is demo.DEFAULT_COMPRESS
    assert parser.parse_args(["--compress"]).compress is True
    assert parser.parse_args(["--compress", "--no-compress"]).compress is False


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--num-envs", "0"], "--num-envs must be >= 1, got 0"),
    (["--stack-size", "0"], "--stack-size must be >= 1, got 0"),
    (["--batch-size", "-1"], "--batch-size must be >= 1, got -1"),
    (["--train-freq", "0"], "--train-freq must be >= 1, got 0"),
    (["--capacity", "3", "--num-envs", "4"], "--capacity (3) must be at least --num-envs (4)"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["--env", "ALE/Pongg-v5"], "--env 'ALE/Pongg-v5': Environment `Pongg` doesn't exist"),
    (["--env", "Pong"], "(Atari games are ALE/<Game>-v5, e.g. ALE/Pong-v5)"),
    (["--env", "not an id"], "--env 'not an id': Malformed environment ID"),
    (["--env", "ALE/Pong-v4"], "--env 'ALE/Pong-v4': Environment version v4"),
    (["--json", "."], "--json .: is a folder; give a file name, e.g. ./report.json"),
    (["--plot", "tests"], "--plot tests: is a folder; give a file name"),
    (["--json", "x.json", "--plot", "x.json"], "--plot and --json are the same file"),
    (["--json", ""], "--json needs a file name"),
])  # fmt: skip
def test_demo_refuses_a_bad_option_in_one_line_before_any_env(args, message):
    assert_one_line_error(run_guarded(DEMO, *args), message)


@pytest.mark.parametrize("args, message", [
    (["--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0'"),
    (["--plot", "no/such/folder/m.png"], "--plot no/such/folder/m.png: the folder"),
    (["--plot", "memory.pngx"], "matplotlib cannot write a 'pngx' file"),
    (["--json", "no/such/folder/r.json"], "--json no/such/folder/r.json: the folder"),
    (["--env", "FrozenLake-v1"], "--env 'FrozenLake-v1': its observations are Discrete(16)"),
])  # fmt: skip
def test_demo_refuses_a_bad_env_or_output_path_in_one_line_before_running(args, message):
    r = run(DEMO, "--steps", "100000", "--no-progress", *args, timeout=120)
    assert_one_line_error(r, message)  # one line: ALE's banner too is printed by an env only


@pytest.mark.parametrize("block, args, message", [
    (["ale_py"], [], "--env ALE/Pong-v5 needs the package 'ale-py'"),
    (["cv2"], [], "--env ALE/Pong-v5 needs the package 'opencv-python-headless'"),
    (["tqdm"], [], "the progress bar (or --no-progress) needs the package 'tqdm'"),
    (["matplotlib"], ["--plot", "m.png"], "--plot needs the package 'matplotlib'"),
    (["lazyframes"], [], "the package lazyframes is not installed"),
])  # fmt: skip
def test_demo_names_the_clone_install_command_of_a_missing_package(block, args, message):
    r = run_guarded(DEMO, *args, block=block)
    clone = " (in the clone)" * (block == ["lazyframes"])
    assert r.stderr == f"demo.py: error: {message}: {INSTALL_DEMO}{clone}\n"
    assert_one_line_error(r, f"{message}: {INSTALL_DEMO}")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    out = ["--json", f"{d}/out.json", "--plot", f"{d}/out.png"]
    r = run(DEMO, "--steps", "200", "--seed", "3", "--compress", *out)  # (the default)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, json.loads((d / "out.json").read_text()), d / "out.png"


def test_demo_report_json_and_plot(demo_run):
    r, rep, png = demo_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.fullmatch(
        r"measured on \d{4}-\d\d-\d\d \(UTC\) on .+, \d+ logical CPUs.*", rep["measured"]
    )
    assert rep["measured"] in r.stdout.splitlines()[:3]  # the machine and the date
    assert "env steps/s" in r.stdout and "sample latency" in r.stdout
    assert "SB3 optimize_memory_usage=True" in r.stdout and "baselines-style" in r.stdout
    assert rep["env"] == "ALE/Pong-v5" and rep["num_envs"] == 1 and rep["stack_size"] == 4
    assert rep["observation_shape"] == [4, 84, 84]
    assert rep["steps"] == 200 and rep["transitions"] == 200 and rep["buffer_len"] == 200
    assert "lazyframes compressed (measured)" in r.stdout
    assert "lazyframes uncompressed (computed)" in r.stdout
    text = " ".join(r.stdout.split())  # the line is wrapped
    assert re.search(r"compressed \(codec zstd, level 1, group 8\): [\d,]+ frames compressed", text)
    assert re.search(r"[\d,]+ held raw; frames [\d.]+x smaller than raw", text)
    assert rep["env_steps_per_s"] > 0 and 0 < rep["stacking_share"] < 1
    t = rep["time"]
    assert all(t[k] >= 0 for k in t)
    assert (
        t["env_s"] + t["stacking_s"] + t["materialise_s"] + t["replay_add_s"] + t["replay_sample_s"]
        <= t["total_s"] * 1.001
    )
    # a batch every 4 steps once 32 transitions are stored: steps 32, 36, ..., 196
    assert rep["samples"] == 42
    lat = rep["sample_latency_us"]
    assert lat["median"] > 0 and lat["mean"] > 0

    m = rep["memory"]
    assert m["frame_bytes"] == 84 * 84 and m["observation_bytes"] == 4 * 84 * 84
    # 200 steps of one episode-start: the reset frame plus one new frame per step
    assert 200 <= m["unique_frames"] <= 201 + 4
    assert m["lazyframes_uncompressed"] >= m["unique_frames"] * m["frame_bytes"]
    # (the held figure includes the sample's ~1 MB scratch)
    assert m["lazyframes"] < m["lazyframes_uncompressed"]
    assert rep["compress"] is True and m["compression"]["codec"] == "zstd"
    assert m["hot_frames"] + m["cold_frames"] >= m["unique_frames"]
    # 200 frames: the pool's fixed costs still weigh as much as the frames saved
    assert 0 < m["cold_bytes"] < m["cold_frames"] * m["frame_bytes"] / 3
    assert m["lazyframes"] < m["sb3_optimized"] < m["naive"]
    assert m["sb3_optimized"] == 200 * (28_224 + 20) and m["naive"] == 200 * (2 * 28_224 + 20)
    assert m["lazyframes"] < m["baselines_after_sampling"] <= m["naive"]
    # every sampled transition converts its obs and next obs: at most 2 per sample drawn
    assert 0 < m["sampled_observations"] <= min(200, 2 * 32 * 42)
    per = m["per_transition"]
    assert per["sb3_optimized"] == 28_244 and per["naive"] == 56_468
    series = rep["series"]
    assert series[-1]["transitions"] == 200
    assert [p["transitions"] for p in series] == sorted(p["transitions"] for p in series)
    assert all("lazyframes_uncompressed" in p for p in series)


def test_demo_scale_stores_the_same_bytes_as_without(demo_run, tmp_path):
    # --scale: ScaledFloatFrame's float32 observations, the frames' bytes stored once
    _, plain, _ = demo_run
    r = run(DEMO, "--steps", "200", "--seed", "3", "--scale", "--json", f"{tmp_path}/s.json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "s.json").read_text())
    assert (
        rep["scale"] is True and "lazyframes (ScaledFloatFrame) compressed (measured)" in r.stdout
    )
    m, p = rep["memory"], plain["memory"]
    assert m["unique_frames"] == p["unique_frames"] and m["frame_bytes"] == 84 * 84
    assert m["lazyframes_uncompressed"] == p["lazyframes_uncompressed"]
    assert m["observation_bytes"] == 4 * 28_224  # the floats' size
    # baselines' scale=True path: float32 frames, 4 B a pixel, before and after sampling
    assert m["per_transition"]["baselines_scaled"] == p["per_transition"]["baselines_scaled"]
    assert p["per_transition"]["baselines_scaled"] == 4 * 7_056 + 20
    assert p["baselines_scaled"] < p["baselines_scaled_after_sampling"] <= 200 * (112_896 + 20)
    assert "baselines scale=True, after sampling" in r.stdout


def test_demo_vector_envs_store_real_transitions_uncompressed(tmp_path):
    args = ["--num-envs", "2", "--batch-size", "8", "--json", f"{tmp_path}/v.json"]
    r = run(DEMO, "--steps", "120", *args, "--no-compress", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "v.json").read_text())
    assert rep["num_envs"] == 2 and rep["steps"] == 120 and rep["buffer_len"] == 120
    # autoreset placeholders are not counted as transitions (none in 60 steps of Pong)
    assert rep["transitions"] == 120 - 0
    m = rep["memory"]
    assert rep["compress"] is False and "frames compressed in" not in r.stdout
    assert m["lazyframes_uncompressed"] <= m["lazyframes"] < m["sb3_optimized"]  # whole chunks


def test_bench_help_lists_its_options_and_benchmarks_and_refuses_an_unknown_one():
    r = run("-m", "bench", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m bench ")
    assert "--quick" in r.stdout and "--only" in r.stdout
    for name in ("core", "wrappers", "replay", "sb3", "compress"):
        assert name in r.stdout
    r = run("-m", "bench", "--only", "nope")
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr and r.stdout == ""


def test_bench_reports_missing_peer_and_failure_in_one_line(tmp_path):
    bench = tmp_path / "fake_bench"  # not "bench": that package is the runner's own
    bench.mkdir()
    (bench / "__init__.py").write_text("")
    (bench / "bench_core.py").write_text("import not_a_real_peer_package_xyz\n")
    (bench / "bench_wrappers.py").write_text("def main(argv):\n    raise RuntimeError('boom')\n")
    (bench / "bench_replay.py").write_text(
        "def main(argv):\n    print('replay table, quick =', argv == ['--quick'])\n"
    )
    code = "from bench.__main__ import run_benches as b; exit(b({}, quick=True, root={!r}))"
    r = run("-c", code.format(["core", "wrappers", "replay", "sb3"], str(bench)))
    assert r.returncode == 1, r.stdout + r.stderr  # the failing one sets the status...
    assert "needs the package 'not_a_real_peer_package_xyz'" in r.stdout
    assert "python -m pip install -e '.[bench]'" in r.stdout
    assert "bench_wrappers failed: RuntimeError: boom" in r.stdout
    assert "replay table, quick = True" in r.stdout  # ...and the others still run
    assert f"bench: bench_sb3.py is not in {bench}; skipped" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr

    r = run("-c", code.format(["core"], str(tmp_path / "nowhere")))
    assert r.returncode == 1
    assert len(r.stdout.strip().splitlines()) == 1 and "not a benchmark folder" in r.stdout


def test_bench_quick_smoke():
    r = run("-m", "bench", "--quick", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("bench_core", "bench_wrappers", "bench_replay", "bench_sb3", "bench_compress"):
        assert f"=== bench/{name}.py --quick ===" in r.stdout
    assert "lazyframes LazyBatch x8" in r.stdout and "gather floor" in r.stdout
    assert "ours compress" in r.stdout and "Traceback" not in r.stdout + r.stderr
    # developer targets only with --check; every table names the machine and the date
    assert "target" not in r.stdout and "MISSED" not in r.stdout
    assert r.stdout.count("measured on ") == 5  # bench_compress's too, since bench/_util


def test_demo_on_an_env_of_tiny_frames_says_what_lazyframes_is_for():
    r = run(DEMO, "--env", "CartPole-v1", "--steps", "200", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "These frames are 16 B: a frame's bookkeeping" in out
    assert "env (ALE + preprocessing)" not in out and "the env, the buffer" in out
