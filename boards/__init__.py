"""FPGA builds: the boards' bitstreams and the measured builds of the design's blocks.

One command line, ``python -m boards build --target array|block|core|board --board
icebreaker|ulx3s`` (:mod:`boards.cli`), over one library:

- :mod:`boards.icebreaker`, :mod:`boards.ulx3s`: one file per board, its top level, clocking
  and build settings (``python -m boards.<board>`` builds its bitstream);
- :mod:`boards.build`: the build plan of a board or of a pin harness, place and route, the
  Fmax search, the reports;
- :mod:`boards.harness`: the pin-limited harness around the array, a block or the core;
- :mod:`boards.tools`: the YoWASP tools and the timed runner;
- :mod:`boards.nextpnr`, :mod:`boards.timing`: what nextpnr reports, and the worst paths from
  its SDF;
- :mod:`boards.clocks`: clock constraints, PLL settings, the UART divisor.
"""
