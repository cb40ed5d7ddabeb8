"""bench/bench_sampler.py and bench_serve.py: smoke runs (figures of a busy host say little)."""


def test_bench_sampler_runs_and_reports_every_row(capsys):
    from bench import bench_sampler

    rows = bench_sampler.main(["--quick", "--transitions", "600", "--steps", "20"])
    out = capsys.readouterr().out
    assert [r["row"] for r in rows] == [
        "raw uint8", "raw float32/255", "pong compressed uint8", "pong compressed float32/255",
    ]  # fmt: skip
    for r in rows:
        assert r["sample_us"] > 0 and r["next_us"] > 0 and r["learn_us"] > 0 and r["left_us"] > 0
        assert r["bound"] >= 0 and r["over"] <= r["visible"]  # the wait the cores allow
    assert "waited/sample" in out and "least wait/sample" in out and "measured on" in out
    texts = [t for t, _ in bench_sampler.check_targets(rows)]
    assert len(texts) == 8 and all("target <= 10.0%" in t for t in texts)


def test_bench_serve_runs_a_learner_process_per_row(capsys):
    from bench import bench_serve

    rows = bench_serve.main(["--quick", "--transitions", "600", "--steps", "10"])
    assert [r["row"] for r in rows] == [
        "raw uint8", "raw float32/255", "pong compressed uint8", "pong compressed float32/255",
    ]  # fmt: skip
    assert all(r["sample_us"] > 0 and r["next_us"] > 0 and r["rate"] > 0 for r in rows)
    assert "BatchClient.next()" in capsys.readouterr().out
