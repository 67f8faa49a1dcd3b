"""TPUConfig validation, derived properties and presets."""

import pytest

from hdl.config import ConfigError, TPUConfig
from hdl.presets import PRESETS, get_config


def test_default_is_8x8():
    cfg = TPUConfig()
    assert (cfg.rows, cfg.cols, cfg.data_width, cfg.acc_width) == (8, 8, 8, 32)
    assert cfg.weight_fifo_depth == 4
    assert cfg.name == "8x8"
    assert cfg.macs == 64
    assert cfg.tile_words == 64
    assert cfg.product_width == 18
    assert cfg.array_latency == 18


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name):
    cfg = get_config(name)
    assert cfg is PRESETS[name]
    assert cfg.replace() == cfg


def test_presets_cover_test_sizes():
    sizes = {(c.rows, c.cols) for c in PRESETS.values()}
    assert {(2, 2), (4, 4), (8, 8), (4, 8), (16, 16)} <= sizes


def test_rxc_names():
    cfg = get_config("4x8")
    assert (cfg.rows, cfg.cols) == (4, 8)


@pytest.mark.parametrize("name, host_width", [("4x4", 128), ("8x8", 256), ("16x16", 512)])
def test_rxc_host_width(name, host_width):
    # The beat follows the array, as for a TPUConfig built with these rows and cols.
    assert get_config(name).host_width == host_width


def test_frozen():
    with pytest.raises(AttributeError):
        TPUConfig().rows = 4


@pytest.mark.parametrize("field, value, allowed", [
    ("rows", 0, "1 to 256"),
    ("cols", 300, "1 to 256"),
    ("data_width", 16, "8"),
    ("acc_width", 24, "32"),
    ("weight_fifo_depth", 0, "1 to 64"),
    ("ub_depth", 1000, "power of two"),
    ("acc_depth", 8, "power of two"),
    ("weight_mem_tiles", 0, "1 to 4096"),
    ("lut_multipliers", 65, "0 to rows * cols = 64"),
    ("multiplier", "dsp", "'infer' or 'ecp5'"),
    ("param_store", "ebr", "'auto' or 'block'"),
    ("matmul_slots", 0, "1 to 8"),
    ("matmul_slots", 9, "1 to 8"),
    ("rows", 4.0, "an int"),
    ("cols", True, "an int"),
    ("ub_to_weights", 1, "True or False"),
])
def test_rejects_bad_values_with_a_clear_message(field, value, allowed):
    with pytest.raises(ConfigError) as info:
        TPUConfig(**{field: value})
    message = str(info.value)
    assert f"TPUConfig.{field}={value!r}" in message
    assert allowed in message


def test_range_end_bits():
    """The hazard tracker's width: an exclusive range end in the largest memory."""
    assert get_config("icebreaker").range_end_bits == 9        # 256 rows: ends 0..256
    assert TPUConfig(ub_depth=65536).range_end_bits == 17      # the ISA's 16-bit fields + 1
    assert TPUConfig(ub_depth=16, acc_depth=16, weight_mem_tiles=100).range_end_bits == 7


def test_unknown_config_name():
    with pytest.raises(ConfigError, match="unknown configuration 'huge'.*tiny"):
        get_config("huge")


def test_serial_unit_keeps_its_own_param_store():
    """The serial activation unit reads its parameters a word at a time from a store of its
    own kind: asking it for another is an error that says so."""
    with pytest.raises(ConfigError, match="param_store='block' is not supported with "
                                          "activation_unit='serial'.*allowed: 'auto'"):
        TPUConfig(activation_unit="serial", param_store="block")


def test_fast_weight_fifo_holds_its_ring():
    """pipeline="fast": two rows of the weight FIFO are its output ring (WeightFIFO
    registered=True), so it needs more than two; the primitive alone does not."""
    with pytest.raises(ConfigError, match="weight_fifo_depth=2 .*more than 2 rows"):
        get_config("tiny").replace(rows=1, weight_fifo_depth=2, pipeline="fast")
    assert get_config("tiny").replace(rows=1, weight_fifo_depth=3, pipeline="fast").rows == 1
    assert get_config("tiny").replace(rows=1, weight_fifo_depth=2, multiplier="ecp5").rows == 1


def test_pipeline_policy():
    """One pipeline axis: three named policies, the presets' choices, a bad name refused
    with the allowed ones, and the fast pipeline refused on the iCE40's shared blocks."""
    assert TPUConfig().pipeline == "reference"
    assert {name: preset.pipeline for name, preset in PRESETS.items()
            if preset.pipeline != "reference"} == {"icebreaker": "compact", "ulx3s": "fast"}
    for bad in ("direct", "pipelined", "", None):
        with pytest.raises(ConfigError, match=rf"TPUConfig.pipeline={bad!r} is not supported; "
                                              r"allowed: 'reference' or 'compact' or 'fast'"):
            TPUConfig(pipeline=bad)
    with pytest.raises(ConfigError, match="pipeline='fast' is not supported with "
                                          "multiplier='ice40'.*allowed: 'reference' or "
                                          "'compact'"):
        get_config("icebreaker").replace(pipeline="fast")
    # The PE latency follows the policy, not the primitive.
    for multiplier in ("infer", "ecp5"):
        cfg = get_config("tiny").replace(multiplier=multiplier)
        assert cfg.array_latency == cfg.rows + cfg.cols + 2
        assert cfg.replace(pipeline="fast").array_latency == cfg.rows + cfg.cols + 6


@pytest.mark.parametrize("rows, cols, fits", [(2, 2, True), (4, 2, True), (4, 8, True),
                                              (16, 16, True), (16, 1, True), (3, 3, False),
                                              (5, 2, False), (32, 32, False), (2, 32, False)])
def test_conv_windows_default_follows_ub_row(rows: int, cols: int, fits: bool):
    """``conv_windows=None`` (the default) is the window mode wherever ``ub_row``
    (``max(rows, cols)``) is a power of two of at most 16, and off elsewhere; asked for
    where it does not fit, it is an error naming the field and ``ub_row``."""
    cfg = TPUConfig(rows=rows, cols=cols)
    assert cfg.conv_windows is fits, cfg
    assert TPUConfig(rows=rows, cols=cols, conv_windows=False).conv_windows is False
    if fits:
        assert TPUConfig(rows=rows, cols=cols, conv_windows=True) == cfg
    else:
        with pytest.raises(ConfigError, match=rf"TPUConfig.conv_windows=True is not supported;"
                                              rf" allowed: False or None with "
                                              rf"ub_row={max(rows, cols)} "):
            TPUConfig(rows=rows, cols=cols, conv_windows=True)


def test_conv_windows_through_replace():
    """``replace`` keeps the window mode where the new ``ub_row`` allows it and drops it
    where not (rather than refusing the copy); a core built without it stays without it;
    an explicit value wins."""
    tiny = get_config("tiny")
    assert tiny.conv_windows and get_config("default").conv_windows
    assert tiny.replace(rows=3, cols=2).conv_windows is False
    assert tiny.replace(rows=4).conv_windows is True
    assert tiny.replace(rows=4).replace(rows=3).conv_windows is False
    with pytest.raises(ConfigError, match="conv_windows=True"):
        tiny.replace(rows=3, conv_windows=True)
    assert tiny.replace(conv_windows=False).replace(rows=4).conv_windows is False
    for name in ("icebreaker", "ulx3s"):
        board = get_config(name)
        assert board.conv_windows is False
        assert board.replace(rows=2, cols=2).conv_windows is False
        assert board.replace(param_slots=1).conv_windows is False
        assert board.replace(conv_windows=None).conv_windows is True
