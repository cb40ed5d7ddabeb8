"""The command line: ``python -m lazyframes --help``, ``demo`` on real Atari, ``bench``."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib  # noqa: F401  (the demo's --plot needs it: part of the test extra)
import pytest
import tqdm  # noqa: F401  (the demo's progress bar)

ROOT = Path(__file__).resolve().parent.parent


def run(*args, cwd=None, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_commands():
    r = run("-m", "lazyframes", "--help")
    assert r.returncode == 0, r.stderr
    assert "demo" in r.stdout and "bench" in r.stdout


def test_no_command_prints_help_and_fails():
    r = run("-m", "lazyframes")
    assert r.returncode == 2
    assert "demo" in r.stdout


def test_demo_help_explains_every_option():
    r = run("-m", "lazyframes", "demo", "--help")
    assert r.returncode == 0, r.stderr
    for opt in (
        "--env",
        "--steps",
        "--num-envs",
        "--capacity",
        "--batch-size",
        "--seed",
        "--plot",
        "--json",
        "--stack-size",
        "--train-freq",
        "--compress",
        "--no-compress",
        "--no-progress",
    ):
        assert opt in r.stdout, opt
    assert "ALE/Pong-v5" in r.stdout


def test_demo_compress_flags():
    """--compress / --no-compress set the option; without either, the demo's default."""
    from lazyframes.__main__ import build_parser
    from lazyframes.demo import DEFAULT_COMPRESS

    parser = build_parser()
    assert parser.parse_args(["demo"]).compress is DEFAULT_COMPRESS
    assert parser.parse_args(["demo", "--compress"]).compress is True
    assert parser.parse_args(["demo", "--compress", "--no-compress"]).compress is False


def test_demo_rejects_bad_options_before_running():
    r = run("-m", "lazyframes", "demo", "--steps", "0", "--no-progress")
    assert r.returncode == 2
    assert "--steps" in r.stderr


def test_version():
    r = run("-m", "lazyframes", "--version")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"lazyframes \d+\.\d+\.\d+\S* \(core: (compiled|reference)\)\n", r.stdout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "ALE/Pongg-v5"], "--env 'ALE/Pongg-v5': Environment `Pongg` doesn't exist"),
        (["--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0'"),
        (["--plot", "no/such/folder/m.png"], "--plot no/such/folder/m.png: the folder"),
        (["--plot", "memory.pngx"], "matplotlib cannot write a 'pngx' file"),
        (["--json", "no/such/folder/r.json"], "--json no/such/folder/r.json: the folder"),
    ],
)
def test_demo_refuses_a_bad_env_or_output_path_in_one_line_before_running(tmp_path, args, message):
    r = run("-m", "lazyframes", "demo", "--steps", "100000", "--no-progress", *args, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("python -m lazyframes demo: error: ") and message in r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stdout == ""


def test_demo_names_the_install_command_of_a_missing_extra(monkeypatch):
    import importlib.util

    from lazyframes import __main__ as cli
    from lazyframes import demo

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tqdm" else real(name, *a)
    )
    args = cli.build_parser().parse_args(["demo"])
    with pytest.raises(ValueError, match=r"needs the package 'tqdm': python -m pip install"):
        demo.check_args(args)


def test_the_console_script_calls_itself_lazyframes(monkeypatch):
    from lazyframes import __main__ as cli

    monkeypatch.setattr(sys, "argv", ["/venv/bin/lazyframes", "--help"])
    assert cli.program_name() == "lazyframes"
    assert cli.build_parser(cli.program_name()).format_usage().startswith("usage: lazyframes ")
    monkeypatch.setattr(sys, "argv", ["/src/lazyframes/__main__.py"])
    assert cli.program_name() == "python -m lazyframes"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    r = run(
        "-m",
        "lazyframes",
        "demo",
        "--steps",
        "200",
        "--json",
        str(d / "out.json"),
        "--plot",
        str(d / "out.png"),
        "--seed",
        "3",
        cwd=d,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r, json.loads((d / "out.json").read_text()), d / "out.png"


def test_demo_report_and_json(demo_run):
    r, rep, _ = demo_run
    assert "env steps/s" in r.stdout and "sample latency" in r.stdout
    assert "SB3 optimize_memory_usage=True" in r.stdout and "baselines-style" in r.stdout
    assert rep["env"] == "ALE/Pong-v5" and rep["num_envs"] == 1 and rep["stack_size"] == 4
    assert rep["observation_shape"] == [4, 84, 84]
    assert rep["steps"] == 200 and rep["transitions"] == 200 and rep["buffer_len"] == 200
    from lazyframes.demo import DEFAULT_COMPRESS

    assert rep["compress"] is DEFAULT_COMPRESS
    assert ("frames compressed in" in r.stdout) is DEFAULT_COMPRESS
    assert rep["env_steps_per_s"] > 0
    assert 0 < rep["stacking_share"] < 1
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
    if rep["compress"]:  # compressed (the held figure includes the sample's ~1 MB scratch);
        # the NumPy twin stores frames raw
        assert m["lazyframes"] <= m["lazyframes_uncompressed"]
        from lazyframes import IMPLEMENTATION

        assert m["lazyframes"] < m["lazyframes_uncompressed"] or IMPLEMENTATION != "compiled"
    else:
        assert m["lazyframes"] >= m["lazyframes_uncompressed"]  # whole chunks
    assert m["lazyframes"] < m["sb3_optimized"] < m["naive"]
    assert m["sb3_optimized"] == 200 * (28_224 + 20)
    assert m["naive"] == 200 * (2 * 28_224 + 20)
    assert m["lazyframes"] < m["baselines_after_sampling"] <= m["naive"]
    # every sampled transition converts its obs and next obs: at most 2 per sample drawn
    assert 0 < m["sampled_observations"] <= min(200, 2 * 32 * 42)
    per = m["per_transition"]
    assert per["sb3_optimized"] == 28_244 and per["naive"] == 56_468
    series = rep["series"]
    assert series[-1]["transitions"] == 200
    assert [p["transitions"] for p in series] == sorted(p["transitions"] for p in series)


def test_demo_plot_is_a_png(demo_run):
    _, _, png = demo_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_report_names_the_machine_and_the_date(demo_run):
    r, rep, _ = demo_run
    assert re.fullmatch(
        r"measured on \d{4}-\d\d-\d\d \(UTC\) on .+, \d+ logical CPUs.*", rep["measured"]
    )
    assert rep["measured"] in r.stdout.splitlines()[:3]


def test_demo_compress_reports_compressed_memory(tmp_path):
    r = run(
        "-m",
        "lazyframes",
        "demo",
        "--steps",
        "200",
        "--compress",
        "--json",
        str(tmp_path / "c.json"),
        "--plot",
        str(tmp_path / "c.png"),
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lazyframes compressed (measured)" in r.stdout
    assert "lazyframes uncompressed (computed)" in r.stdout
    text = " ".join(r.stdout.split())  # the line is wrapped
    assert re.search(r"compressed \(codec lz4, level 9, group 16\): [\d,]+ frames compressed", text)
    assert re.search(r"[\d,]+ held raw; frames [\d.]+x smaller than raw", text)
    rep = json.loads((tmp_path / "c.json").read_text())
    m = rep["memory"]
    assert rep["compress"] is True and m["compression"]["codec"] == "lz4"
    assert m["hot_frames"] + m["cold_frames"] >= m["unique_frames"]
    assert m["lazyframes_uncompressed"] >= m["unique_frames"] * m["frame_bytes"]
    if rep["implementation"] == "compiled":  # the twin stores frames uncompressed
        # 200 frames: the pool's fixed costs still weigh as much as the frames saved
        assert 0 < m["cold_bytes"] < m["cold_frames"] * m["frame_bytes"] / 3
    assert all("lazyframes_uncompressed" in p for p in rep["series"])
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_vector_envs_store_real_transitions(tmp_path):
    r = run(
        "-m",
        "lazyframes",
        "demo",
        "--steps",
        "120",
        "--num-envs",
        "2",
        "--batch-size",
        "8",
        "--json",
        str(tmp_path / "v.json"),
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "v.json").read_text())
    assert rep["num_envs"] == 2 and rep["steps"] == 120 and rep["buffer_len"] == 120
    # autoreset placeholders are not counted as transitions (none in 60 steps of Pong)
    assert rep["transitions"] == 120 - 0
    assert rep["memory"]["lazyframes"] < rep["memory"]["sb3_optimized"]


def test_bench_reports_missing_peer_and_failure_in_one_line(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "__init__.py").write_text("")
    (bench / "bench_core.py").write_text("import not_a_real_peer_package_xyz\n")
    (bench / "bench_wrappers.py").write_text(
        textwrap.dedent("""
        def main(argv=None):
            raise RuntimeError("boom")
    """)
    )
    (bench / "bench_replay.py").write_text(
        textwrap.dedent("""
        import argparse
        def main(argv=None):
            p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true")
            a = p.parse_args(argv)
            print("replay table, quick =", a.quick)
            return []
    """)
    )
    code = (
        "import sys; from lazyframes.__main__ import run_benches; "
        f"sys.exit(run_benches(['core', 'wrappers', 'replay'], quick=True, root={str(bench)!r}))"
    )
    r = run("-c", code, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr  # the failing one sets the status...
    assert "needs the package 'not_a_real_peer_package_xyz'" in r.stdout
    assert "bench_wrappers failed: RuntimeError: boom" in r.stdout
    assert "replay table, quick = True" in r.stdout  # ...and the others still run
    assert "Traceback" not in r.stdout + r.stderr

    r = run(
        "-c",
        "import sys; from lazyframes.__main__ import run_benches; "
        f"sys.exit(run_benches(['core'], quick=True, root={str(tmp_path / 'nowhere')!r}))",
    )
    assert r.returncode == 1
    assert len(r.stdout.strip().splitlines()) == 1 and "no bench/ folder" in r.stdout


def test_bench_quick_smoke():
    r = run("-m", "lazyframes", "bench", "--quick", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("bench_core", "bench_wrappers", "bench_replay", "bench_sb3", "bench_compress"):
        assert f"=== bench/{name}.py --quick ===" in r.stdout
    assert "lazyframes LazyBatch x8" in r.stdout and "gather floor" in r.stdout
    assert "ours compress" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    # developer targets only with --check; every table names the machine and the date
    assert "target" not in r.stdout and "MISSED" not in r.stdout
    assert r.stdout.count("measured on ") == 4
