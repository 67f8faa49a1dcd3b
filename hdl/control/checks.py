"""The front end's error checks: whether the instruction at fetch may run, and if not, why."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.control.activation_engine import window_log2
from hdl.control.hazards import ADDR_END_BITS
from hdl.isa import (
    INSTR_BITS,
    Activate,
    ErrorCode,
    Instr,
    LoadParams,
    LoadTable,
    LoadWeights,
    Matmul,
    Opcode,
    UbToWeights,
)

__all__ = ["Checks"]


class Checks(wiring.Component):
    """Checks the instruction word at the front end's fetch against the configuration and the
    front end's decode-level state, and reports the first check that fails, in the priority
    order of :class:`~hdl.isa.ErrorCode`: unknown opcode, bad field, signedness (a core for
    int8 only, :attr:`~hdl.config.TPUConfig.operands`), unified-buffer, accumulator and
    weight-memory range, unwritten tile, no tile to switch in, weight FIFO overflow.

    When the answers are the word's own depends on :attr:`~hdl.config.TPUConfig.pipeline`
    (:class:`~hdl.control.dispatch.Dispatch` waits for them):

    - ``"reference"``: in the cycle the word is shown;
    - ``"compact"``: the range ends (``o_a_end``, ``o_b_end``) are registered before they are
      compared, so the answers are the word's own from its second cycle;
    - ``"fast"``: as ``"compact"``, and each check's answer is registered before they are
      combined (the tile check keeps its tiles and ORs them a cycle later): from its third
      cycle.

    A word that is not an instruction (a data beat) gets answers too; the front end ignores
    them.

    Members
    -------
    i_word : In(INSTR_BITS)
        The instruction word at fetch.
    i_written : In(weight_mem_tiles)
        The tiles LOAD_WEIGHTS has written.
    i_queued : In(range(weight_fifo_depth + 2))
        Tiles read into the weight FIFO and not yet switched in.
    i_have_active : In(1)
        A tile has been switched in.
    o_a_end, o_b_end : Out(ADDR_END_BITS)
        The ends of the word's ranges, ``a + count`` and ``b + count`` (``b + count >>
        pool`` for ACTIVATE, ``a`` plus :func:`~hdl.isa.window_rows` for a window MATMUL,
        saturated): the hazard tracker's too.
    o_tile_mask : Out(weight_mem_tiles)
        The tiles ``a`` .. ``a_end - 1`` (meaningful once the weight range check passes).
    o_error : Out(ErrorCode)
        The first check that fails, or NONE.
    o_failed : Out(1)
        Some check fails.
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        super().__init__({
            "i_word":        In(INSTR_BITS),
            "i_written":     In(cfg.weight_mem_tiles),
            "i_queued":      In(range(cfg.weight_fifo_depth + 2)),
            "i_have_active": In(1),
            "o_a_end":       Out(ADDR_END_BITS),
            "o_b_end":       Out(ADDR_END_BITS),
            "o_tile_mask":   Out(cfg.weight_mem_tiles),
            "o_error":       Out(ErrorCode),
            "o_failed":      Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        word = self.i_word
        instr = data.View(Instr, word)
        op = instr.opcode
        mm = data.View(Matmul, word)
        av = data.View(Activate, word)
        lw = data.View(LoadWeights, word)
        lp = data.View(LoadParams, word)
        uw = data.View(UbToWeights, word)
        a, b, count = instr.a, instr.b, instr.count
        a_end, b_end = self.o_a_end, self.o_b_end
        window_log = Signal(2)
        m.d.comb += window_log.eq(window_log2(av.pool))
        # Registered but with "reference": the beat offered last cycle's, its own once it has
        # stayed a cycle, so that the compares do not start at the beat.
        ends = m.d.comb if cfg.pipeline == "reference" else m.d.sync
        a_count = a + count
        if cfg.conv_windows:
            # A window MATMUL reads the rows holding elements lane .. lane + (count - 1) *
            # step + rows - 1 (isa.window_rows): ub_row is a power of two, so the row is the
            # element's high bits. Saturated to the range end's width (the sum can be wider;
            # anything that large is past ub_depth).
            lg = cfg.ub_row.bit_length() - 1
            last = Signal(range((1 << 16) * 16 + 16 + cfg.rows))
            m.d.comb += last.eq(mm.lane + (count - 1) * mm.step + (cfg.rows - 1))
            window_end = Signal(ADDR_END_BITS + 4)
            m.d.comb += window_end.eq(a + (last >> lg) + 1)
            saturated = Mux(window_end[ADDR_END_BITS:].any(), (1 << ADDR_END_BITS) - 1,
                            window_end[:ADDR_END_BITS])
            a_count = Mux((op == Opcode.MATMUL) & mm.window, saturated, a_count)
        if cfg.pipeline == "fast":
            # An adder for each window and the choice after them, so that the adders start
            # at the beat (the opcode's decode and the window's shift ran into b_end's carry
            # chain).
            b_ends = [b + (count >> k) for k in range(3)]
            b_shifted = Mux(window_log[1], b_ends[2], Mux(window_log[0], b_ends[1], b_ends[0]))
            ends += [a_end.eq(a_count),
                     b_end.eq(Mux(op == Opcode.ACTIVATE, b_shifted, b_ends[0]))]
        else:
            ends += [a_end.eq(a_count),
                     b_end.eq(b + Mux(op == Opcode.ACTIVATE, count >> window_log, count))]

        # A core without UB_TO_WEIGHTS (TPUConfig.ub_to_weights) or the programmable table
        # (lookup_table) does not know its opcode, and builds none of its checks (so that its
        # netlist is the one without the instruction).
        moves = cfg.ub_to_weights
        is_ = {o: op == o for o in cfg.opcodes}
        unknown = ~Cat(*is_.values()).any()
        # MATMUL_LOOKUP is checked as a MATMUL without the window (its `table` is MATMUL's
        # `window` bit).
        matmul = is_[Opcode.MATMUL]
        if cfg.sum_tables:
            matmul = matmul | is_[Opcode.MATMUL_LOOKUP]
        # A function this core does not have (TPUConfig.functions).
        func_value = av.func.as_value()
        bad_func = ~Cat(*(func_value == f.value for f in cfg.functions)).any()

        needs_count = (is_[Opcode.READ_HOST] | is_[Opcode.WRITE_HOST] |
                       is_[Opcode.LOAD_WEIGHTS] | is_[Opcode.READ_WEIGHTS] |
                       matmul | is_[Opcode.ACTIVATE])
        if moves:
            needs_count = needs_count | is_[Opcode.UB_TO_WEIGHTS]
        window_mask = Signal(2)
        m.d.comb += window_mask.eq((1 << window_log) - 1)
        bad_field = (
            (needs_count & (count == 0)) |
            (is_[Opcode.ACTIVATE] & (bad_func |
                                     (av.pool.as_value() == 3) |
                                     ((count & window_mask) != 0) |
                                     (av.slot >= cfg.param_slots))) |
            (is_[Opcode.LOAD_PARAMS] & ((lp.slot >= cfg.param_slots) |
                                        (lp.rounding.as_value() == 3))))
        # A window MATMUL needs the window mode, and a lane inside a row.
        window_field = (is_[Opcode.MATMUL] & mm.window &
                        ((mm.lane >= cfg.ub_row) if cfg.conv_windows else Const(1)))
        bad_field = bad_field | window_field
        if cfg.sum_tables:      # a table the core has (without the sum tables, no target)
            target = data.View(LoadTable, word).target.as_value()
            bad_field = bad_field | (is_[Opcode.LOAD_TABLE] & (target == 3))
        if moves:   # a buffer row per column of the tile (transpose), else per row
            bad_field = bad_field | (is_[Opcode.UB_TO_WEIGHTS] &
                                     Mux(uw.transpose, count > cfg.cols, count > cfg.rows))
        # A core for int8 only (TPUConfig.operands) refuses uint8 tiles and activations.
        signedness = ((is_[Opcode.LOAD_WEIGHTS] & ~lw.signed) | (matmul & ~mm.signed)
                      if cfg.operands == "int8" else Const(0))
        if moves and cfg.operands == "int8":
            signedness = signedness | (is_[Opcode.UB_TO_WEIGHTS] & ~uw.signed)
        # MATMUL: a = ub_addr, b = acc_addr. ACTIVATE: a = acc_addr, b = ub_addr.
        # UB_TO_WEIGHTS: a = ub_addr, b = tile.
        reads_a = is_[Opcode.READ_HOST] | is_[Opcode.WRITE_HOST] | matmul
        if moves:
            reads_a = reads_a | is_[Opcode.UB_TO_WEIGHTS]
        ub_range = ((reads_a & (a_end > cfg.ub_depth)) |
                    (is_[Opcode.ACTIVATE] & (b_end > cfg.ub_depth)))
        acc_range = ((matmul & (b_end > cfg.acc_depth)) |
                     (is_[Opcode.ACTIVATE] & (a_end > cfg.acc_depth)))
        weight_range = ((is_[Opcode.LOAD_WEIGHTS] | is_[Opcode.READ_WEIGHTS]) &
                        (a_end > cfg.weight_mem_tiles))
        if moves:   # its one tile b, compared as it is (no range end on the tracker's path)
            weight_range = weight_range | (is_[Opcode.UB_TO_WEIGHTS] &
                                           (b >= cfg.weight_mem_tiles))
        # Tiles a .. a_end - 1, used only once weight_range passes (so from the fields' low
        # bits): two thermometer codes, LUTs where a compare per tile took two carry chains.
        tiles, tile_bits = cfg.weight_mem_tiles, cfg.weight_mem_tiles.bit_length()
        ones = Const((1 << tiles) - 1, tiles)
        tile_mask = self.o_tile_mask
        m.d.comb += tile_mask.eq((ones << a[:tile_bits])[:tiles] &
                                 ~(ones << a_end[:tile_bits])[:tiles])
        weight_unwritten = is_[Opcode.READ_WEIGHTS] & ((tile_mask & ~self.i_written) != 0)
        queued = self.i_queued
        weight_empty = matmul & Mux(mm.switch, queued == 0, ~self.i_have_active)
        # queued + count > depth + 1 without a 16-bit adder: count alone is too large, or
        # (then it fits in over_bits) the sum of its low bits is.
        over_bits = (cfg.weight_fifo_depth + 1).bit_length() + 1
        weight_overflow = is_[Opcode.READ_WEIGHTS] & (
            (count > cfg.weight_fifo_depth + 1) |
            (queued + count[:over_bits] > cfg.weight_fifo_depth + 1))
        checks = [   # in priority order: the first that fails is reported
            (unknown, ErrorCode.UNKNOWN_OPCODE),
            (bad_field, ErrorCode.BAD_FIELD),
            (signedness, ErrorCode.SIGNEDNESS),
            (ub_range, ErrorCode.UB_RANGE),
            (acc_range, ErrorCode.ACC_RANGE),
            (weight_range, ErrorCode.WEIGHT_RANGE),
            (weight_unwritten, ErrorCode.WEIGHT_UNWRITTEN),
            (weight_empty, ErrorCode.WEIGHT_EMPTY),
            (weight_overflow, ErrorCode.WEIGHT_OVERFLOW),
        ]
        if cfg.pipeline == "fast":
            # The checks' answers registered, so that no check's logic runs into the
            # dispatch's registers. The tile check keeps its tiles (`unwritten`), ORed a cycle
            # later: its masks and the wide OR together were the longest.
            others = [failed for failed, code in checks if code != ErrorCode.WEIGHT_UNWRITTEN]
            checked = Signal(len(others))
            unwritten = Signal(tiles)
            m.d.sync += [checked.eq(Cat(*others)),
                         unwritten.eq(Mux(is_[Opcode.READ_WEIGHTS],
                                          tile_mask & ~self.i_written, 0))]
            bits = iter(checked)     # in the order of `others`, the checks' order
            checks = [(unwritten.any() if code == ErrorCode.WEIGHT_UNWRITTEN else next(bits), code)
                      for _, code in checks]
        for failed, code in reversed(checks):    # later assignments win
            with m.If(failed):
                m.d.comb += self.o_error.eq(code)
        m.d.comb += self.o_failed.eq(Cat(*(failed for failed, _ in checks)).any())
        return m
