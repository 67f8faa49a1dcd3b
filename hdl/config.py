"""Accelerator parameters: one frozen dataclass and its derived properties (the named
configurations are :mod:`hdl.presets`).

Only composite blocks take a :class:`TPUConfig`; leaf blocks (the PE, the weight FIFO) take
explicit keyword arguments derived from it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from hdl.isa import Func, Opcode

__all__ = ["TPUConfig", "ConfigError", "OPTIONAL_OPCODES", "OPTIONAL_FUNCS", "MULTIPLIERS",
           "ACTIVATION_UNITS", "PARAM_STORES", "PIPELINES", "OPERAND_KINDS"]

#: Instructions a core may be built without, and the :class:`TPUConfig` flag that builds
#: each: without it the opcode is unknown (UNKNOWN_OPCODE).
OPTIONAL_OPCODES = {Opcode.UB_TO_WEIGHTS: "ub_to_weights", Opcode.LOAD_TABLE: "lookup_table",
                    Opcode.MATMUL_LOOKUP: "sum_tables"}

#: ACTIVATE's functions a core may be built without, and the flag that builds each: without
#: it the function is a bad field (BAD_FIELD).
OPTIONAL_FUNCS = {Func.TABLE: "lookup_table", Func.NORMALISE: "row_scale"}

#: How a PE's DSP product is built (:attr:`TPUConfig.multiplier`).
MULTIPLIERS = ("infer", "ecp5", "ice40")

#: Which operands the core multiplies (:attr:`TPUConfig.operands`).
OPERAND_KINDS = ("any", "int8")

#: How the activation unit is built (:attr:`TPUConfig.activation_unit`).
ACTIVATION_UNITS = ("pipelined", "serial")

#: Where the activation engine keeps its parameter slots (:attr:`TPUConfig.param_store`).
PARAM_STORES = ("auto", "block")

#: Where the core's registers sit (:attr:`TPUConfig.pipeline`).
PIPELINES = ("reference", "compact", "fast")


class ConfigError(ValueError):
    """A configuration value is out of the supported range."""


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class TPUConfig:
    """Parameters of one accelerator instance.

    The matrix unit computes ``Y = X @ W`` for a weight tile ``W`` of ``rows x cols`` (``rows``
    is the reduction dimension K, ``cols`` the output dimension N): activation rows of ``rows``
    elements enter from the left, output rows of ``cols`` partial sums leave at the bottom.

    Attributes
    ----------
    rows, cols : int
        Rows and columns of processing elements (the length of an activation row, of an output row),
        1 to 256 each.
    data_width, acc_width : int
        Width of activations and weights, 8 (int8 or uint8, chosen per stream or tile), and of
        partial sums and accumulators, 32 (two's complement, wrapping).
    weight_fifo_depth : int
        Weight tiles the weight FIFO holds (TPU v1: 4), 1 to 64.
    ub_depth, acc_depth : int
        Rows of the unified buffer (activations) and of the accumulator memory, each a power of two,
        16 to 65536.
    weight_mem_tiles : int
        Weight tiles the on-chip weight memory holds, 1 to 4096.
    param_slots : int
        Requantisation parameter slots (bias, multiplier, shift, zero point), 1 to 8.
    host_width : int or None
        Bits in one beat of the host stream, a multiple of 8 that holds an instruction (64 bits) and
        any data row (a unified-buffer row, a weight row, a row of ``cols`` int32). ``None``: the
        smallest such.
    lut_multipliers : int
        How many PEs (the last ones, in row-major order) build their multiplier from LUT logic
        instead of a DSP block, for parts with fewer DSPs than PEs (iCE40UP5K: 8 SB_MAC16 for a 4x4
        array -> 8), 0 to rows * cols. They take the other PEs' registers (:attr:`pipeline`), so
        that every PE has the same latency.
    multiplier : str
        Which primitive the other PEs' products are built on (where the registers sit is
        :attr:`pipeline`'s choice). ``"infer"``: a ``*`` that synthesis maps to a DSP block,
        registers in the fabric (any part). ``"ecp5"``: an instantiated ECP5 ``MULT18X18D`` holding
        the operand and product registers, the activation unit's multipliers too (ECP5 parts; same
        cycles, higher Fmax). ``"ice40"``: two PEs' products in one iCE40 ``SB_MAC16`` in its dual
        8x8 mode, its input and product registers the PEs' (iCE40 parts; the block's signedness is
        fixed, so ``operands="int8"``; a 4x4 array takes the UP5K's 8 blocks). See
        :class:`hdl.datapath.pe.PE`, :mod:`hdl.datapath.dual_mult`.
    activation_unit : str
        ``"pipelined"``: a requantisation datapath per column, a row a cycle
        (:mod:`hdl.datapath.activation`). ``"serial"``, for small parts: one datapath time-shared
        over the columns, a multi-cycle multiply and shift, 37 to 99 cycles an element
        (:mod:`hdl.datapath.activation_serial`). Same results.
    counter_bits : int
        Width of the performance counters, 32 to 48 (narrower for small parts); they wrap at
        ``2**counter_bits`` (a counter beat still carries 48 bits, the upper ones zero).
    param_store : str
        Where the activation engine keeps the requantisation parameter slots (a row of ``cols``
        int32 biases, one of multipliers and the scalars each). ``"auto"``: as synthesis chooses
        (flip-flops or distributed RAM for so small a memory). ``"block"``, for small parts: block
        RAM; same timing and results. For the pipelined unit only: the serial unit's slots are
        always one 32-bit-wide block RAM, a word per column, kind and slot, read a word at a time
        (``"auto"``; :mod:`hdl.control.param_store`).
    pipeline : str
        Where the core's registers sit, one policy for the whole design (independent of
        :attr:`multiplier`). All three give the same results and beats, in different cycles and at
        different Fmax; the random-program regression proves each equal to the ISA simulator.

        - ``"reference"``: the readable specification. An instruction may issue in its first cycle
          at the front end (its checks and the hazard tracker's answer decide in that cycle);
          memories answer a read in one cycle; a PE's latency is 3.
        - ``"compact"``: the small-part build (the iCEBreaker's). The ends of an instruction's
          ranges and the word the hazard tracker is asked about are registered before they are
          compared, and what depends on the opcode and the engines' readiness is decided a cycle
          ahead, so no adder or compare runs from the instruction word into the dispatch: an
          instruction issues at the earliest in its third cycle. Nothing else changes.
        - ``"fast"``: the retimed build for high clocks (the ULX3S's). As ``"compact"``, and each
          check's answer and the engines' readiness are registered before they are combined, the
          hazard tracker answers a cycle late (an instruction issues at the earliest in its fourth
          cycle); the unified buffer, weight memory and accumulators read through their block RAMs'
          output registers (a cycle more; the accumulators forward the rows in flight); the weight
          FIFO's rows leave through a ring of registers; the array's enable is a register decided a
          cycle ahead; each PE has two more registers each side of its multiplier (latency 7);
          LOAD_WEIGHTS and READ_WEIGHTS scale their tile counts to rows a cycle late when ``rows``
          is not a power of two; on a board the link's checks and the link-core beats are
          registered. Not with ``multiplier="ice40"``, whose shared block holds the PEs' registers.
    operands : str
        ``"any"``: each activation stream and weight tile is int8 or uint8 (its instruction's
        ``signed`` flag), multiplied as 9-bit signed values. ``"int8"``: int8 only, so the products
        fit 8 x 8 multipliers (``multiplier="ice40"``); a ``LOAD_WEIGHTS`` or ``MATMUL`` with
        ``signed`` clear stops the core with ``ErrorCode.SIGNEDNESS`` before it has any effect.
        Compile for it with :func:`firmware.quant.quantise`'s ``input_signed=True``.
    matmul_slots : int
        MATMULs in flight at once (issuing, in the array, or being accumulated), 1 to 8 (fewer for
        small parts): the matrix engine's slots and the hazard tracker's recorded ranges (a buffer
        and an accumulator range each, four compares against an instruction's two ranges). A MATMUL
        waits for a free slot, so with fewer, short MATMULs back to back wait for the oldest to
        drain from the array. Same results.
    ub_to_weights : bool
        Build UB_TO_WEIGHTS (:class:`hdl.isa.UbToWeights`): unified-buffer rows into a weight
        tile, transposed or not, through a tile buffer of ``rows x cols`` bytes in flip-flops
        (attention's Kᵀ and V without the host link). ``False`` (both board presets for now):
        the opcode is then unknown (``ErrorCode.UNKNOWN_OPCODE``).
    lookup_table : bool
        Build the activation unit's programmable table (LOAD_TABLE, :class:`hdl.isa.LoadTable`,
        and ACTIVATE's function TABLE): 256 bytes, a copy per column in the pipelined unit (a
        block RAM each), one in the serial unit's table memory. ``False``: LOAD_TABLE's opcode
        is unknown and the function TABLE a bad field.
    row_scale : bool
        Build ACTIVATE's function NORMALISE (:data:`hdl.isa.Func`): each row divided by its
        last column's accumulator, through a reciprocal table that replaces the multiplier
        for the row (softmax's division after ``e @ [v | 1]``). ``False``: NORMALISE is a bad
        field.
    conv_windows : bool or None
        Build MATMUL's ``window`` mode (:class:`hdl.isa.Matmul`): each array row a window of
        ``rows`` elements at a step of its own through the unified buffer read as one run of
        elements, so a convolution reads its input as the tensor itself (TPU v1's data setup
        over overlapping buffer rows). The matrix engine keeps the last two rows it read and
        shifts the window out of them and the row arriving. Needs ``ub_row`` a power of two
        of at most 16 (a window's element address splits into row and lane by bits, its lane
        fits the instruction's four bits). ``None`` (the default): where ``ub_row`` allows.
        ``False``: a window MATMUL is a bad field (BAD_FIELD).
    sum_tables : bool or None
        Build MATMUL_LOOKUP (:class:`hdl.isa.MatmulLookup`) and LOAD_TABLE's two sum tables:
        256 int32 entries each, indexed by a sum's low byte, a copy per column beside the
        accumulators (read in the stage that reads the old sums), so that a residual ADD's
        two scaled inputs add up in the accumulators exactly as TFLite and onnxruntime
        compute them. Needs ``lookup_table`` (LOAD_TABLE); ``None`` (the default): where the
        core has it. ``False`` (both board presets): MATMUL_LOOKUP's opcode is unknown and
        LOAD_TABLE's ``target`` is not decoded (every LOAD_TABLE is the activation table's; the
        netlist is the one before the sum tables).
    """

    rows: int = 8
    cols: int = 8
    data_width: int = 8
    acc_width: int = 32
    weight_fifo_depth: int = 4
    ub_depth: int = 1024
    acc_depth: int = 512
    weight_mem_tiles: int = 64
    param_slots: int = 4
    host_width: int | None = None
    lut_multipliers: int = 0
    multiplier: str = "infer"
    activation_unit: str = "pipelined"
    counter_bits: int = 48
    param_store: str = "auto"
    pipeline: str = "reference"
    operands: str = "any"
    matmul_slots: int = 4
    ub_to_weights: bool = True
    lookup_table: bool = True
    row_scale: bool = True
    conv_windows: bool | None = None
    sum_tables: bool | None = None

    def __post_init__(self):
        def check(name: str, ok: bool, allowed: str):
            if not ok:
                raise ConfigError(f"TPUConfig.{name}={getattr(self, name)!r} is not "
                                  f"supported; allowed: {allowed}")

        def one_of(name: str, values: tuple[str, ...]):
            value = getattr(self, name)
            check(name, isinstance(value, str) and value in values,
                  " or ".join(repr(allowed) for allowed in values))

        for name in ("rows", "cols", "data_width", "acc_width", "weight_fifo_depth",
                     "ub_depth", "acc_depth", "weight_mem_tiles", "param_slots",
                     "lut_multipliers", "counter_bits", "matmul_slots"):
            value = getattr(self, name)
            check(name, isinstance(value, int) and not isinstance(value, bool), "an int")
        check("rows", 1 <= self.rows <= 256, "1 to 256")
        check("cols", 1 <= self.cols <= 256, "1 to 256")
        check("data_width", self.data_width == 8, "8 (int8/uint8 operands)")
        check("acc_width", self.acc_width == 32, "32 (int32 accumulation)")
        check("weight_fifo_depth", 1 <= self.weight_fifo_depth <= 64, "1 to 64 tiles")
        for name in ("ub_depth", "acc_depth"):
            check(name, _is_pow2(getattr(self, name)) and 16 <= getattr(self, name) <= 65536,
                  "a power of two from 16 to 65536 rows")
        check("weight_mem_tiles", 1 <= self.weight_mem_tiles <= 4096, "1 to 4096 tiles")
        check("param_slots", 1 <= self.param_slots <= 8, "1 to 8")
        if self.host_width is None:
            object.__setattr__(self, "host_width", self.min_host_width)
        check("host_width", isinstance(self.host_width, int) and
              not isinstance(self.host_width, bool), "an int or None")
        check("host_width",
              self.host_width >= self.min_host_width and self.host_width % 8 == 0,
              f"a multiple of 8 of at least {self.min_host_width} bits (an instruction, a "
              f"unified-buffer row, a weight row and a row of {self.cols} int32 must fit)")
        check("lut_multipliers", 0 <= self.lut_multipliers <= self.rows * self.cols,
              f"0 to rows * cols = {self.rows * self.cols}")
        one_of("multiplier", MULTIPLIERS)
        one_of("activation_unit", ACTIVATION_UNITS)
        check("counter_bits", 32 <= self.counter_bits <= 48, "32 to 48 bits")
        # (pipeline="fast": the weight FIFO's output ring holds two rows of its storage.)
        check("weight_fifo_depth", self.pipeline != "fast" or
              self.rows * self.weight_fifo_depth > 2,
              f"with pipeline='fast', more than 2 rows of weight FIFO (rows={self.rows} x "
              f"depth)")
        check("matmul_slots", 1 <= self.matmul_slots <= 8, "1 to 8")
        one_of("param_store", PARAM_STORES)
        if self.activation_unit == "serial" and self.param_store != "auto":
            raise ConfigError(f"TPUConfig.param_store={self.param_store!r} is not supported "
                              f"with activation_unit='serial' (its parameters are always a "
                              f"32-bit word per column in block RAM); allowed: 'auto'")
        one_of("pipeline", PIPELINES)
        if self.pipeline == "fast" and self.multiplier == "ice40":
            raise ConfigError("TPUConfig.pipeline='fast' is not supported with "
                              "multiplier='ice40' (an SB_MAC16 shared by two PEs holds their "
                              "operand and product registers, so the PE cannot take the fast "
                              "build's registers around it); allowed: 'reference' or 'compact'")
        one_of("operands", OPERAND_KINDS)
        check("ub_to_weights", isinstance(self.ub_to_weights, bool), "True or False")
        check("lookup_table", isinstance(self.lookup_table, bool), "True or False")
        check("row_scale", isinstance(self.row_scale, bool), "True or False")
        if self.sum_tables is None:
            object.__setattr__(self, "sum_tables", self.lookup_table)
        check("sum_tables", isinstance(self.sum_tables, bool), "True, False or None")
        check("sum_tables", self.lookup_table or not self.sum_tables,
              "False with lookup_table=False (the sum tables are loaded by LOAD_TABLE)")
        windows_fit = _is_pow2(self.ub_row) and self.ub_row <= 16
        if self.conv_windows is None:
            object.__setattr__(self, "conv_windows", windows_fit)
        check("conv_windows", isinstance(self.conv_windows, bool), "True, False or None")
        check("conv_windows", windows_fit or not self.conv_windows,
              f"False or None with ub_row={self.ub_row} (max(rows, cols)): the window mode "
              f"needs a power of two of at most 16")
        if self.multiplier == "ice40" and self.operands != "int8":
            raise ConfigError(f"TPUConfig.multiplier='ice40' needs operands='int8' (an "
                              f"SB_MAC16's dual 8x8 multipliers are signed 8-bit, fixed per "
                              f"block), not operands={self.operands!r}")

    @property
    def name(self) -> str:
        """Short name used for build directories, e.g. ``8x8``."""
        return f"{self.rows}x{self.cols}"

    @property
    def ub_row(self) -> int:
        """Elements in a unified-buffer row: MATMUL reads the first ``rows``, ACTIVATE writes
        the first ``cols``."""
        return max(self.rows, self.cols)

    @property
    def min_host_width(self) -> int:
        """Narrowest host beat that carries an instruction and every kind of data row."""
        return max(64, self.data_width * self.ub_row, self.acc_width * self.cols)

    @property
    def product_width(self) -> int:
        """Width of one signed product of two operands extended to ``data_width + 1`` bits."""
        return 2 * (self.data_width + 1)

    @property
    def products_per_dsp(self) -> int:
        """Products one DSP block holds: two with ``multiplier="ice40"`` (an SB_MAC16's dual
        8x8 mode), else one."""
        return 2 if self.multiplier == "ice40" else 1

    @property
    def dsp_blocks(self) -> int:
        """DSP blocks the array's products take (those not in LUTs, :attr:`lut_multipliers`)."""
        return -(-(self.macs - self.lut_multipliers) // self.products_per_dsp)

    @property
    def operand_range(self) -> tuple[int, int]:
        """Smallest and largest operand value the core multiplies."""
        return (-128, 127) if self.operands == "int8" else (-128, 255)

    def psum_bits(self, terms: int) -> int:
        """Bits of a signed sum of *terms* products (of operands in :attr:`operand_range`),
        which can then never wrap: the width of a partial sum ``terms`` PEs down a column,
        sign-extended to ``acc_width`` at the array's bottom edge."""
        lo, hi = self.operand_range
        products = (lo * hi, max(lo * lo, hi * hi))
        low, high = terms * min(products), terms * max(products)
        return max((-low - 1).bit_length(), high.bit_length()) + 1

    @property
    def macs(self) -> int:
        """Multiply-accumulates the array performs per cycle at full utilisation."""
        return self.rows * self.cols

    @property
    def tile_words(self) -> int:
        """Weights in one tile."""
        return self.rows * self.cols

    @property
    def range_end_bits(self) -> int:
        """Bits of the exclusive end of a range in the largest memory (unified buffer,
        accumulators or weight tiles): the width the hazard tracker compares."""
        return max(self.ub_depth, self.acc_depth, self.weight_mem_tiles).bit_length()

    @property
    def scale_tiles_late(self) -> bool:
        """Whether LOAD_WEIGHTS (the front end) and READ_WEIGHTS (the weight loader) scale
        their tile and count fields to rows (``* rows``) in the cycle after they take the
        instruction, from registers, instead of from the instruction word as they take it:
        the fast pipeline with ``rows`` not a power of two, where the multiply is adders.
        Each such instruction takes a cycle more."""
        return self.pipeline == "fast" and self.rows & (self.rows - 1) != 0

    @property
    def array_latency(self) -> int:
        """Cycles from accepting an activation row to presenting its output row: the skew
        and de-skew (``rows + cols - 1``) plus a PE's latency (3; 7 with ``pipeline="fast"``,
        whose PEs register the operands twice before the multiplier and the product twice
        after it, see :class:`hdl.datapath.pe.PE`)."""
        return self.rows + self.cols + (6 if self.pipeline == "fast" else 2)

    @functools.cached_property
    def opcodes(self) -> tuple[Opcode, ...]:
        """The :class:`~hdl.isa.Opcode` members a core of this configuration decodes: all of
        them but those of instructions it is built without (:data:`OPTIONAL_OPCODES`), which
        are unknown to it."""
        return tuple(o for o in Opcode
                     if o not in OPTIONAL_OPCODES or getattr(self, OPTIONAL_OPCODES[o]))

    @functools.cached_property
    def functions(self) -> tuple[Func, ...]:
        """ACTIVATE's functions (:class:`~hdl.isa.Func`) a core of this configuration has:
        all but those it is built without (:data:`OPTIONAL_FUNCS`), which are bad fields."""
        return tuple(f for f in Func
                     if f not in OPTIONAL_FUNCS or getattr(self, OPTIONAL_FUNCS[f]))

    def replace(self, **changes) -> TPUConfig:
        """A copy with some fields changed (validated again). A core with the window mode
        (:attr:`conv_windows`) keeps it unless told otherwise, as far as the new ``ub_row``
        allows it, and one with the sum tables as far as the new ``lookup_table`` does."""
        if "conv_windows" not in changes and self.conv_windows:
            changes["conv_windows"] = None
        if "sum_tables" not in changes and self.sum_tables:
            changes["sum_tables"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
