"""The performance report's arithmetic, plots and page (bench/report.py) on synthetic records
for a 2x2 core, and its amaranth.sim benches (the stream through the 2x2 matrix unit, a GEMM
program on the 2x2 core), which check their results: fast, no Verilator or Icarus build."""

from __future__ import annotations

import json

import pytest

from bench import report
from bench.measure import PROGRAM, amaranth_program_speed, amaranth_stream_speed

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ridge_points():
    # 8x8: peak 128 ops/cycle over a 256-bit (32-byte) beat -> 4 ops per host byte.
    assert report.peak_ops_per_cycle(8, 8) == 128
    assert report.host_bytes_per_cycle(256) == 32
    assert report.ridge_point(8, 8, 256) == 4.0
    assert report.ridge_point(4, 4, 128) == 2.0
    assert report.ridge_point(16, 16, 512) == 8.0
    assert report.ridge_point(4, 8, 256) == 2.0
    # Weight path: a cols-byte row per cycle -> 2 * rows ops per weight byte.
    assert report.weight_ridge_point(8, 8) == 16
    assert report.weight_ridge_point(16, 4) == 32
    # The roof: the host slope left of the ridge, flat peak right of it, continuous there.
    assert report.roof(1.0, 8, 8, 256) == 32
    assert report.roof(4.0, 8, 8, 256) == 128
    assert report.roof(100.0, 8, 8, 256) == 128


def _counters(cycles: int, active: int, **others) -> dict:
    c = {name: 0 for name in ("cycles", "instructions", "array_active", "useful_macs",
                              "weight_stall", "weight_shift", "non_matrix", "raw_stall",
                              "host_stall")}
    c.update(cycles=cycles, array_active=active, useful_macs=4 * active, instructions=9,
             **others)
    return c


def _records() -> list[dict]:
    # 2x2 core: host beat 64 bits = 8 bytes a cycle, peak 8 ops/cycle, ridge 1 op/byte.
    base = {"config": "2x2", "rows": 2, "cols": 2, "host_bytes_per_beat": 8, "beats_out": 3,
            "bytes_out": 24, "wall_s": 0.1}
    compute = {**base, "workload": "big", "kind": "gemm", "what": "square", "m": 10, "k": 10,
               "n": 4, "ops": 800, "beats_in": 50, "bytes_in": 400, "program_cycles": 200,
               "counters": _counters(100, 95, weight_shift=20)}
    # A network: 20 model MACs an image (the counter's 48 include padding) over 2 images in
    # 100 cycles on 4 PEs = 10 %, against a 50 % shape bound; stage b not profiled.
    host = {**base, "workload": "small", "kind": "network", "what": "digits", "images": 2,
            "batch_size": 2, "ops": 100, "beats_in": 50, "bytes_in": 400,
            "program_cycles": 100, "counters": _counters(100, 12, host_stall=60),
            "useful_macs_per_image": 20, "model_macs": 40, "bound": 0.5, "profile_images": 2,
            "cycles_per_image": 50.0,
            "stages": [
                {"name": "a", "useful_macs_per_image": 12.0, "slots_per_image": 20.0,
                 "bound": 0.6, "profile_cycles": 30, "profile_array_active": 6,
                 "profile_useful_macs": 24.0, "profile_utilisation": 0.2},
                {"name": "b", "useful_macs_per_image": 8.0, "slots_per_image": 20.0,
                 "bound": 0.4, "profile_cycles": None, "profile_array_active": 0,
                 "profile_useful_macs": 16.0, "profile_utilisation": None}],
            "links": [{"board": "Testboard", "preset": "tiny", "clock_mhz": 10.0,
                       "baud": 1_000_000, "same_core": True, "batch_size": 2,
                       "to_board_per_image": 800.0, "from_board_per_image": [50.0, 60.0],
                       "link_images_per_s": 123.4, "link_images_per_s_worst": 123.4,
                       "bound_by": "to", "core_images_per_s": 200_000.0}]}
    return [compute, host]


def test_analyse():
    compute, host = (report.analyse(r) for r in _records())
    assert compute["ridge"] == 1.0 and compute["peak"] == 8
    assert compute["intensity"] == 2.0 and compute["attainable"] == 8
    assert compute["achieved"] == 4.0 and compute["of_roof"] == pytest.approx(50)
    assert compute["utilisation"] == pytest.approx(95)
    assert compute["host_region"] == "compute" and compute["weight_region"] == "compute"
    assert compute["weight_intensity"] == pytest.approx(2 * 4 * 95 / (20 * 2))
    assert host["intensity"] == 0.25 and host["attainable"] == 2.0
    assert host["host_region"] == "host link" and host["weight_region"] == "-"
    assert host["worst_stall"] == "input (host) stall"
    assert host["shares"]["input (host) stall"] == pytest.approx(60)
    # Model MACs, not the counter's: 40 / (2 x 2 x 100); the bound and the ratio in %.
    assert host["model_utilisation"] == pytest.approx(10)
    assert host["bound"] == pytest.approx(50) and host["of_bound"] == pytest.approx(20)
    assert host["cycles_per_image"] == 50
    assert "model_utilisation" not in compute and "bound" not in compute
    a, b = report.stage_figures(_records()[1])
    assert (a["name"], a["bound"], a["measured"]) == ("a", pytest.approx(60), pytest.approx(20))
    assert a["of_bound"] == pytest.approx(100 / 3) and a["cycles"] == 30
    assert b["measured"] is None and b["of_bound"] is None


def test_utilisation_plot_draws_bounds(tmp_path, monkeypatch):
    # Keep the figure the plot closes, to read its lines back.
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    report.plot_cycles_utilisation(_records(), tmp_path / "u.png")
    _, ax_u = figures[0].axes
    lines = {line.get_label(): line for line in ax_u.get_lines()}
    assert set(lines) == {"big", "small (model MACs)", "small shape bound"}
    measured, bound = lines["small (model MACs)"], lines["small shape bound"]
    assert list(measured.get_ydata()) == [pytest.approx(10)]
    assert list(bound.get_ydata()) == [pytest.approx(50)]
    assert bound.get_linestyle() == "--" and measured.get_linestyle() == "-"
    assert bound.get_color() == measured.get_color()
    assert list(lines["big"].get_ydata()) == [pytest.approx(95)]


def test_report_from_cache(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "docs"
    results.mkdir()
    (results / "workloads.json").write_text(json.dumps(
        {"date": "2026-01-01 00:00 UTC", "machine": "test", "images": 2,
         "records": _records()}))
    (results / "simspeed.json").write_text(json.dumps(
        {"date": "2026-01-01 00:00 UTC", "records": [
            {"driver": PROGRAM, "sim": "verilator", "config": "2x2",
             "cycles": 1000, "wall_s": 0.01, "cycles_per_s": 100000.0}]}))
    assert report.main(["--cached", "--results", str(results), "--docs", str(docs)]) == 0
    page = (docs / "performance.md").read_text()
    for name in ("perf_cycles_utilisation", "perf_roofline", "perf_synthesis",
                 "perf_simspeed"):
        png = docs / "img" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
        assert f"(img/{name}.png)" in page or name == "perf_synthesis"
    assert "No synthesis sweep recorded yet" in page
    # The roofline table: 2x2 ridge 1.0 op per host byte, 4 per weight byte.
    assert "| 2x2 | 8 | 64 | 8 | 1.0 | 4 |" in page
    assert "| big | 2x2 | 400 | 2.00 | 4.0 | 8.0 | 50 % | compute | 19.0 | compute |" in page
    assert "| small | 2x2 | 400 | 0.25 | 1.0 | 2.0 | 50 % | host link | - | - |" in page
    assert "**95.0 %** | weight shift 20 % |" in page
    assert f"| {PROGRAM} | 2x2 | 100,000 |" in page
    # The networks against their bounds, the board's core and link images/s, per stage.
    assert ("| 2x2 | small | 2 (batch 2) | 50.0 | **10.0 %** | 50.0 % | 20 % | Testboard "
            "(10 MHz, 1,000,000 baud): core 200,000, link **123** |") in page
    assert "| 2x2 | small | a | 12 | 20 | 60.0 % | **20.0 %** | 33 % | 30 |" in page
    assert "| 2x2 | small | b | 8 | 20 | 40.0 % | - | - | - |" in page
    assert "2026-01-01 00:00 UTC" in page


def test_amaranth_stream_bench():
    r = amaranth_stream_speed("tiny", tiles=2, rows=8)    # checks every row against golden
    assert r["cycles"] >= 16 and r["cycles_per_s"] > 0


def test_amaranth_program_bench():
    # The whole 2x2 core runs a 4x4 GEMM from a ROM; its answers are checked against the
    # ISA simulator's inside.
    r = amaranth_program_speed("2x2", 4)
    assert r["cycles"] > 100 and r["cycles_per_s"] > 0
