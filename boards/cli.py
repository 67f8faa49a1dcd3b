"""The one FPGA build command: ``python -m boards build --target T --board B [options]``.

Targets:

- ``board``: the board's bitstream, the whole core behind a UART (``make bitstream``, also
  ``python -m boards.<board>``); fails unless the clock asked for is met.
- ``array``: the systolic array in the pin harness (``make synth``); products beyond the
  part's DSP blocks go to LUTs unless ``--lut-multipliers`` says otherwise.
- ``core``: the whole core (no host link) in the pin harness.
- ``block``: one block of the core (``--block``) in the pin harness.

A harness build reports nextpnr's achieved Fmax against the clock it was asked (``--clock``,
default a little above what the board reaches); ``--runs N`` searches for the Fmax with up to
N place-and-routes. ``--paths N`` (ULX3S) also lists the worst paths into N different
registers, from nextpnr's SDF. Every build's files are under ``build/boards/``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from boards.build import BUILD_ROOT, Board, build_board, build_harness, format_harness
from boards.harness import BLOCKS
from boards.tools import BuildError
from hdl.config import ACTIVATION_UNITS, MULTIPLIERS, PIPELINES, ConfigError, TPUConfig
from hdl.presets import PRESETS, get_config

__all__ = ["TARGETS", "BOARDS", "board", "configure", "main"]

TARGETS = ("array", "block", "core", "board")
#: The boards, each described by ``BOARD`` in ``boards/<name>.py``.
BOARDS = ("icebreaker", "ulx3s")
#: The multiplier each board's DSP blocks are instantiated as (``TPUConfig.multiplier``).
_FAMILY_MULTIPLIER = {"ice40": "ice40", "ecp5": "ecp5"}


def board(name: str) -> Board:
    """The :class:`Board` of ``boards/<name>.py``."""
    if name not in BOARDS:
        raise ValueError(f"board {name!r} is not supported; allowed: {', '.join(BOARDS)}")
    return importlib.import_module(f"boards.{name}").BOARD


def configure(spec: Board, target: str, name: str | None, **changes) -> tuple[str, TPUConfig]:
    """The preset's name and the configuration to build: the preset *name* (default: the
    board build's, or for an array the board's array preset) with *changes* (``rows``,
    ``cols``, ``lut_multipliers``, ``multiplier``, ``activation_unit``, ``pipeline``,
    ``ub_to_weights``, ``lookup_table``, ``conv_windows``; ``None`` keeps the preset's).
    ``multiplier="ice40"`` makes the core int8-only, as its dual products need. An array's
    products beyond the part's DSP blocks go to LUTs unless *lut_multipliers* says
    otherwise. Raises :class:`ConfigError` naming what is allowed."""
    name = name or (spec.array_config if target == "array" else spec.config)
    config = get_config(name)
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes.get("multiplier") == "ice40":
        changes["operands"] = "int8"
    if changes:
        # host_width=None: the beat widens with the rows.
        config = config.replace(**changes, host_width=None)
    return name, config


def _fit_dsps(config: TPUConfig, dsps: int) -> TPUConfig:
    return config.replace(lut_multipliers=max(config.lut_multipliers,
                                              config.macs - config.products_per_dsp * dsps))


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="build")
    # A board file (python -m boards.<board>) gives its own name and the target and board.
    p = commands.add_parser("build", help="synthesise, place and route a target on a board",
                            prog=f"{prog} build" if prog == "python -m boards" else prog,
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, choices=TARGETS, help="what to build")
    p.add_argument("--board", required=True, choices=BOARDS, help="which board")
    p.add_argument("--part", help="the board's FPGA (ulx3s: 85F, 45F, 25F, 12F; default the "
                                  "first)")
    p.add_argument("--block", choices=BLOCKS, help="with --target block: which block")
    p.add_argument("--config", help=f"preset or RxC (default: the board build's preset; for "
                                    f"--target array the board's array preset); presets: "
                                    f"{', '.join(PRESETS)}")
    p.add_argument("--rows", type=int, help="the configuration's array rows, resized")
    p.add_argument("--cols", type=int, help="the configuration's array columns, resized")
    p.add_argument("--lut-multipliers", type=int, metavar="N",
                   help="products built in LUTs instead of DSP blocks (--target array: "
                        "default those beyond the part's DSP blocks)")
    p.add_argument("--multiplier", choices=MULTIPLIERS,
                   help="how DSP products are built (TPUConfig.multiplier); ecp5 on ulx3s, "
                        "ice40 on icebreaker only")
    p.add_argument("--activation-unit", choices=ACTIVATION_UNITS,
                   help="the configuration's activation unit (serial: no multipliers)")
    p.add_argument("--pipeline", choices=PIPELINES,
                   help="the configuration's pipeline policy (TPUConfig.pipeline)")
    for name, what in (("ub-to-weights", "UB_TO_WEIGHTS (TPUConfig.ub_to_weights)"),
                       ("lookup-table", "the programmable table, LOAD_TABLE "
                                        "(TPUConfig.lookup_table)"),
                       ("conv-windows", "MATMUL's window mode (TPUConfig.conv_windows)")):
        p.add_argument(f"--{name}", choices=("yes", "no"),
                       help=f"build {what} or not (default: the preset's)")
    p.add_argument("--clock", type=float, metavar="MHZ",
                   help="the clock asked for (default: the board build's; a harness's first "
                        "constraint, above the Fmax the board usually reaches)")
    p.add_argument("--seed", type=int, default=1,
                   help="nextpnr's placement seed (default 1, nextpnr's own); Fmax moves by a "
                        "few per cent from seed to seed")
    p.add_argument("--paths", type=int, default=0, metavar="N",
                   help="also list the worst paths into N different registers, from "
                        "nextpnr-ecp5's SDF (what a faster clock must shorten; ulx3s only)")
    p.add_argument("--router", choices=("router1", "router2"), default="router1",
                   help="nextpnr's router (router2 for large arrays; default router1)")
    p.add_argument("--baud", type=int, help="--target board: the UART's baud rate")
    p.add_argument("--runs", type=int, default=1,
                   help="harness targets: place-and-route runs at most; above 1 the "
                        "constraint is raised or lowered to find the Fmax (default 1)")
    p.add_argument("--budget", type=float, default=600.0,
                   help="with --runs: seconds after which no further run starts once a "
                        "constraint has passed (default 600)")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="with --runs: stop when the lowest failing constraint is within this "
                        "fraction of the highest passing one (default 0.03)")
    p.add_argument("--out", type=Path, default=BUILD_ROOT,
                   help=f"harness targets: output folder (default {BUILD_ROOT})")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print the build plans' commands")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: Board) -> None:
    """Options that do not fit the target or board: a usage error naming what is allowed."""
    if args.target == "block" and args.block is None:
        parser.error(f"--target block needs --block; allowed: {', '.join(BLOCKS)}")
    if args.target != "block" and args.block is not None:
        parser.error(f"--block is for --target block, not --target {args.target}")
    if args.part is not None and args.part not in spec.parts:
        parser.error(f"--part {args.part} is not a part of {spec.name}; allowed: "
                     f"{', '.join(spec.parts)}")
    if args.paths and spec.family != "ecp5":
        parser.error(f"--paths reads nextpnr-ecp5's SDF; allowed on: "
                     f"{', '.join(b for b in BOARDS if board(b).family == 'ecp5')}")
    vendor = {m: f for f, m in _FAMILY_MULTIPLIER.items()}
    if args.multiplier in vendor and vendor[args.multiplier] != spec.family:
        parser.error(f"--multiplier {args.multiplier} instantiates {vendor[args.multiplier]} "
                     f"DSP blocks; allowed on {spec.name}: infer, "
                     f"{_FAMILY_MULTIPLIER[spec.family]}")
    if args.target == "board":
        for option, value in (("--runs", args.runs != 1), ("--budget", args.budget != 600.0),
                              ("--tolerance", args.tolerance != 0.03),
                              ("--out", args.out != BUILD_ROOT)):
            if value:
                parser.error(f"{option} is for the harness targets (array, block, core), not "
                             f"--target board")
    elif args.baud is not None:
        parser.error("--baud is for --target board (the UART), not a harness target")
    if args.runs < 1:
        parser.error(f"--runs {args.runs}; allowed: 1 or more")


def main(argv: list[str] | None = None, *, prog: str = "python -m boards") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    spec = board(args.board)
    _check(parser, args, spec)
    part = args.part or spec.default_part
    changes = {"rows": args.rows, "cols": args.cols, "lut_multipliers": args.lut_multipliers,
               "multiplier": args.multiplier, "activation_unit": args.activation_unit,
               "pipeline": args.pipeline,
               **{name: None if value is None else value == "yes"
                  for name, value in (("ub_to_weights", args.ub_to_weights),
                                      ("lookup_table", args.lookup_table),
                                      ("conv_windows", args.conv_windows))}}
    try:
        preset, config = configure(spec, args.target, args.config, **changes)
        if args.target == "array" and args.lut_multipliers is None:
            config = _fit_dsps(config, spec.dsps[part])
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    router = "" if args.router == "router1" else f"--router {args.router}"

    if args.target == "board":
        label = spec.name + (f"-{part.lower()}" if len(spec.parts) > 1 else "")
        resized = {k: v for k, v in changes.items() if v is not None}
        if resized:
            label += "-" + "-".join(f"{k}{v}" for k, v in resized.items())
        try:
            report = build_board(spec, config, part=part, clock_mhz=args.clock,
                                 baud=args.baud, seed=args.seed, nextpnr_opts=router,
                                 paths=args.paths, label=label)
        except (BuildError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(report.table())
        return 0

    if config.dsp_blocks > spec.dsps[part]:
        print(f"warning: {config.macs - config.lut_multipliers} DSP products need "
              f"{config.dsp_blocks} > {spec.dsps[part]} {spec.dsp_cell}; placement will fail "
              f"(use --lut-multipliers)", file=sys.stderr)
    result = build_harness(spec, config, target=args.target, block=args.block, part=part,
                           clock_mhz=args.clock, seed=args.seed, runs=args.runs,
                           budget_s=args.budget, tolerance=args.tolerance, paths=args.paths,
                           nextpnr_opts=router, preset=preset, out_dir=args.out,
                           say=lambda message: print(message, flush=True))
    print()
    print(format_harness(result, spec, paths=args.paths))
    if args.verbose:
        for command in result["commands"]:
            print(f"  $ {command}")
    return 1 if result["errors"] or (args.runs > 1 and result["fmax"] is None) else 0


if __name__ == "__main__":
    sys.exit(main())


def board_main(board_name: str, argv: list[str] | None = None) -> int:
    """``python -m boards.<board_name>``: ``python -m boards build --target board --board
    <board_name>`` with *argv* (the command line's by default)."""
    return main(["build", "--target", "board", "--board", board_name,
                 *(sys.argv[1:] if argv is None else argv)],
                prog=f"python -m boards.{board_name}")
