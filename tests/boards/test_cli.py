"""``python -m boards build``: the one FPGA build command rejects what it cannot build with
a message naming what it can, before anything is built."""

from __future__ import annotations

import pytest

from boards import cli


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_bad_target_names_the_targets(capsys):
    err = _usage_error(capsys, ["build", "--target", "chip", "--board", "icebreaker"])
    assert "invalid choice: 'chip'" in err
    assert all(f"'{target}'" in err for target in ("array", "block", "core", "board")), err


def test_bad_board_names_the_boards(capsys):
    err = _usage_error(capsys, ["build", "--target", "array", "--board", "arty"])
    assert "invalid choice: 'arty'" in err
    assert "'icebreaker'" in err and "'ulx3s'" in err, err
    with pytest.raises(ValueError, match="allowed: icebreaker, ulx3s"):
        cli.board("arty")


@pytest.mark.parametrize("argv, message", [
    (["--target", "block", "--board", "ulx3s"], "--target block needs --block; allowed: array, "
                                                "core, activation"),
    (["--target", "core", "--board", "ulx3s", "--block", "hazards"],
     "--block is for --target block"),
    (["--target", "board", "--board", "ulx3s", "--part", "95F"],
     "allowed: 85F, 45F, 25F, 12F"),
    (["--target", "core", "--board", "icebreaker", "--paths", "5"], "allowed on: ulx3s"),
    (["--target", "array", "--board", "icebreaker", "--multiplier", "ecp5"],
     "allowed on icebreaker: infer, ice40"),
    (["--target", "board", "--board", "icebreaker", "--runs", "3"],
     "--runs is for the harness targets"),
    (["--target", "array", "--board", "icebreaker", "--baud", "115200"],
     "--baud is for --target board"),
])
def test_options_that_do_not_fit(capsys, argv: list[str], message: str):
    assert message in _usage_error(capsys, ["build", *argv])


def test_bad_config_is_an_error(capsys):
    """A preset that does not exist, or a resize the configuration does not allow."""
    assert cli.main(["build", "--target", "core", "--board", "ulx3s", "--config", "huge"]) == 1
    assert "allowed: tiny, small" in capsys.readouterr().err
    assert cli.main(["build", "--target", "array", "--board", "icebreaker", "--rows", "4",
                     "--cols", "4", "--lut-multipliers", "17"]) == 1
    assert "0 to rows * cols = 16" in capsys.readouterr().err


def test_array_config_fits_the_dsps():
    """An array's products beyond the part's DSP blocks go to LUTs, as ``make synth`` builds
    it; ``multiplier="ice40"`` puts two in each block and makes the core int8-only."""
    board = cli.board("icebreaker")
    preset, config = cli.configure(board, "array", None)
    assert preset == "small" and cli._fit_dsps(config, 8).lut_multipliers == 8
    _, dual = cli.configure(board, "array", None, multiplier="ice40")
    assert dual.operands == "int8" and cli._fit_dsps(dual, 8).lut_multipliers == 0
    assert cli.configure(board, "board", None)[0] == "icebreaker"
    assert cli.configure(cli.board("ulx3s"), "core", None)[0] == "ulx3s"
