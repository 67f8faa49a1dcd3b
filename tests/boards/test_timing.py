"""boards.timing: the worst paths into different registers, from an SDF written the way
nextpnr-ecp5 writes one (a delay or check on a line, picoseconds)."""

from __future__ import annotations

from boards.timing import Sdf, format_paths, worst_paths


def _ff(name: str) -> str:
    return f"""(CELL
 (CELLTYPE "TRELLIS_FF")
 (INSTANCE {name})
 (DELAY (ABSOLUTE
  (IOPATH CLK Q (500:500:500) (500:500:500))
 ))
 (TIMINGCHECK
  (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (0:0:0))
 )
)"""


SDF = "\n".join([
    "(DELAYFILE",
    _ff("src_TRELLIS_FF_Q"), _ff("dst_TRELLIS_FF_Q"), _ff("dst_TRELLIS_FF_Q_1"),
    _ff("other_TRELLIS_FF_Q"),
    """(CELL
 (CELLTYPE "TRELLIS_COMB")
 (INSTANCE lut_LUT4_Z)
 (DELAY (ABSOLUTE
  (IOPATH A F (300:300:300) (300:300:300))
 ))
)
(CELL
 (CELLTYPE "top")
 (INSTANCE )
 (DELAY (ABSOLUTE
  (INTERCONNECT src_TRELLIS_FF_Q/Q lut_LUT4_Z/A (1000:1000:1000) (1000:1000:1000))
  (INTERCONNECT lut_LUT4_Z/F dst_TRELLIS_FF_Q/DI (200:200:200) (200:200:200))
  (INTERCONNECT lut_LUT4_Z/F dst_TRELLIS_FF_Q_1/DI (400:400:400) (400:400:400))
  (INTERCONNECT src_TRELLIS_FF_Q/Q other_TRELLIS_FF_Q/DI (700:700:700) (700:700:700))
 ))
)
)""",
])


def test_worst_paths_one_per_register():
    paths = worst_paths(Sdf.parse(SDF), period_ns=2.0, count=5)
    # dst's two bits are one register: only its worse path (the 400 ps route) is listed.
    assert [(p["from_group"], p["to_group"], p["delay_ns"], p["slack_ns"], p["cells"])
            for p in paths] == [("src", "dst", 2.3, -0.3, 3), ("src", "other", 1.3, 0.7, 2)]
    assert paths[0]["via"] == ["src_TRELLIS_FF_Q", "lut_LUT4_Z", "dst_TRELLIS_FF_Q_1"]
    assert worst_paths(Sdf.parse(SDF), period_ns=2.0, count=1) == paths[:1]
    text = format_paths(paths)
    assert "2.30 ns (slack -0.30)  3 cells  src -> dst" in text, text
