"""Functional coverage of random programs: named points, their counts, and what was promised.

Two sources fill a :class:`Coverage`:

- the programs themselves (:class:`ProgramObserver` decodes the host stream the generator
  wrote, so it counts what is in the programs, not what the generator meant to write): which
  instructions, flags and functions appeared, which boundaries of each memory were touched
  (first row, last row, a single-row transfer, a transfer of the whole memory), and which
  hazard rules the programs set up (an instruction whose rows meet those of the nearest
  earlier instruction the rule names, with no fence between them), and the waits outside
  those rules that the programs set up (a LOAD_TABLE right behind an ACTIVATE, which waits
  for it; an ACTIVATE of the function TABLE right behind a LOAD_TABLE); and, from an ISA
  simulator the observer runs the programs on, the divisors each NORMALISE met (one, zero or
  negative, small enough for an exact reciprocal, large enough to be cut) and whether a
  shift grown by the cut was clamped at 63;
- the RTL (:func:`observe_rtl`, from :meth:`firmware.transports.rtl.RtlDevice.coverage`):
  cycles the core stalled on each rule of :data:`hdl.control.hazards.HAZARD_RULES` and
  cycles each pair of engines (:data:`sim.rtl.host_bridge.OVERLAPS`) worked at once.

:func:`promised_points` lists the points a configuration can reach (a MATMUL cannot cover the
whole unified buffer when it is deeper than the accumulators, say); a test fails when one of
them was never hit. (Not ``coverage.py``: that name belongs to the package cocotb imports
when ``COVERAGE=1``, and this folder is on the testbench's import path.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from firmware.asm import field_specs
from hdl import isa
from hdl.config import TPUConfig
from hdl.control.hazards import HAZARD_RULES
from sim.models.isa_sim import POOL_WINDOW, IsaSim
from sim.rtl.host_bridge import OVERLAPS

__all__ = ["Coverage", "ProgramObserver", "promised_points", "observe_rtl", "MEMORY_ACCESSES",
           "RULE_ACCESSES", "RESERVED_BITS", "format_table", "activate_functions"]

_INSTR_MASK = (1 << isa.INSTR_BITS) - 1

#: Instructions that wait until every unit is idle: no hazard reaches across them.
FENCES = frozenset({isa.Opcode.SYNC, isa.Opcode.HALT, isa.Opcode.READ_COUNTERS,
                    isa.Opcode.CLEAR_COUNTERS})


def activate_functions(config: TPUConfig) -> list[isa.Func]:
    """ACTIVATE's functions that valid random programs draw on ``config``: the fixed ones,
    TABLE where the core has the programmable table and NORMALISE where it has the row scale
    (on one without them, each a BAD_FIELD)."""
    return list(config.functions)


#: NORMALISE's divisors (a row's last accumulator column), by what the reciprocal does with
#: them: 1 (the largest reciprocal), 0 or less (a reciprocal of 0: the zero point), exact
#: (below ``2**RECIPROCAL_BITS``), cut to its top bits (here at least ``2**12``).
DIVISOR_KINDS = ("divisor=1", "divisor<=0", "divisor=2..511", "divisor>=4096")
assert isa.RECIPROCAL_BITS == 9     # (the names above)


def _divisor_kind(d: int) -> str | None:
    if d == 1:
        return "divisor=1"
    if d <= 0:
        return "divisor<=0"
    if d < 1 << isa.RECIPROCAL_BITS:
        return "divisor=2..511"
    if d >= 1 << 12:
        return "divisor>=4096"
    return None


#: (instruction, memory) pairs whose boundaries are counted; memory ``ub`` (unified-buffer
#: rows), ``acc`` (accumulator rows) or ``tile`` (weight tiles).
MEMORY_ACCESSES = (("read_host", "ub"), ("write_host", "ub"), ("matmul", "ub"),
                   ("matmul", "acc"), ("activate", "acc"), ("activate", "ub"),
                   ("load_weights", "tile"), ("read_weights", "tile"),
                   ("ub_to_weights", "ub"), ("ub_to_weights", "tile"))

#: Per rule of HAZARD_RULES: (waiting instruction, its memory, unfinished instruction, its
#: memory), ``ub``, ``acc`` or ``tile``; the rows of each that meet.
RULE_ACCESSES = {
    "read_host_war_matmul":          ("read_host", "ub", "matmul", "ub"),
    "read_host_waw_activate":        ("read_host", "ub", "activate", "ub"),
    "read_host_war_write_host":      ("read_host", "ub", "write_host", "ub"),
    "write_host_raw_activate":       ("write_host", "ub", "activate", "ub"),
    "load_weights_war_read_weights": ("load_weights", "tile", "read_weights", "tile"),
    "matmul_raw_activate":           ("matmul", "ub", "activate", "ub"),
    "matmul_war_activate_acc":       ("matmul", "acc", "activate", "acc"),
    "activate_raw_matmul_acc":       ("activate", "acc", "matmul", "acc"),
    "activate_war_matmul":           ("activate", "ub", "matmul", "ub"),
    "activate_war_write_host":       ("activate", "ub", "write_host", "ub"),
    "ub_to_weights_raw_activate":    ("ub_to_weights", "ub", "activate", "ub"),
    "ub_to_weights_war_read_weights": ("ub_to_weights", "tile", "read_weights", "tile"),
}
assert tuple(RULE_ACCESSES) == HAZARD_RULES


class Coverage:
    """Named coverage points with hit counts, some of them promised.

    Points keep the order they were first promised or hit in; :meth:`table` prints them.
    """

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.promised: list[str] = []

    def promise(self, names: Iterable[str]) -> None:
        """Points that must be hit (each listed with 0 hits until it is)."""
        for name in names:
            self.counts.setdefault(name, 0)
            if name not in self.promised:
                self.promised.append(name)

    def hit(self, name: str, count: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(count)

    def merge(self, other: Coverage) -> None:
        self.promise(other.promised)
        for name, count in other.counts.items():
            self.hit(name, count)

    def missing(self) -> list[str]:
        """Promised points never hit."""
        return [name for name in self.promised if not self.counts.get(name)]

    def table(self, title: str = "coverage point") -> str:
        return format_table({"hits": self.counts}, title=title, promised=self.promised)

    def to_json(self) -> str:
        return json.dumps({"counts": self.counts, "promised": self.promised})

    @classmethod
    def from_json(cls, text: str) -> Coverage:
        raw = json.loads(text)
        cov = cls()
        cov.promise(raw["promised"])
        for name, count in raw["counts"].items():
            cov.hit(name, count)
        return cov


def format_table(columns: Mapping[str, Mapping[str, int]], title: str = "coverage point",
                 promised: Sequence[str] = ()) -> str:
    """Points down, one column of hits per entry of ``columns``; ``-`` where a column has no
    such point, and ``MISSED`` after a promised point some column never hit."""
    names: list[str] = []
    for counts in columns.values():
        names += [n for n in counts if n not in names]
    width = max([len(title), *(len(n) for n in names)])
    heads = list(columns)
    cell = max([9, *(len(h) for h in heads)])
    lines = [f"{title:<{width}}  " + "  ".join(f"{h:>{cell}}" for h in heads),
             "-" * (width + (cell + 2) * len(heads))]
    promised = set(promised)
    for name in names:
        cells = []
        missed = False
        for counts in columns.values():
            if name in counts:
                cells.append(f"{counts[name]:>{cell}}")
                missed |= name in promised and not counts[name]
            else:
                cells.append(f"{'-':>{cell}}")
        lines.append(f"{name:<{width}}  " + "  ".join(cells) + ("  MISSED" if missed else ""))
    return "\n".join(lines)


def _reachable_full(config: TPUConfig, op: str, memory: str) -> bool:
    """Whether one instruction ``op`` can cover all of ``memory`` on ``config``."""
    ub, acc, tiles = config.ub_depth, config.acc_depth, config.weight_mem_tiles
    if op in ("read_host", "write_host", "load_weights"):
        return True
    if op == "matmul":
        return (ub <= acc) if memory == "ub" else (acc <= ub)
    if op == "activate":
        windows = POOL_WINDOW.values()
        if memory == "acc":
            return any(acc % w == 0 and acc // w <= ub for w in windows)
        return any(ub * w <= acc for w in windows)
    if op == "read_weights":
        return tiles <= config.weight_fifo_depth + 1
    if op == "ub_to_weights":       # one tile, of at most max(rows, cols) buffer rows
        return (ub <= max(config.rows, config.cols)) if memory == "ub" else tiles == 1
    raise ValueError(op)


def promised_points(config: TPUConfig, rtl: bool = True,
                    max_count: int | None = None) -> list[str]:
    """The points the generator promises to hit on ``config`` (with ``rtl``, the RTL's
    stall and overlap points too); ``max_count``: the longest transfer it draws, if not the
    whole memory (then a transfer of all of a deeper memory is not promised)."""
    depths = {"ub": config.ub_depth, "acc": config.acc_depth, "tile": config.weight_mem_tiles}
    moves = config.ub_to_weights        # a core without UB_TO_WEIGHTS refuses it
    table = config.lookup_table         # a core without the table refuses LOAD_TABLE, TABLE
    ops = config.opcodes
    rules = [rule for rule in HAZARD_RULES if moves or not rule.startswith("ub_to_weights")]
    points = [f"op.{op.name.lower()}" for op in ops] + ["resync_word"]
    # A core for int8 only refuses signed=0 (a SIGNEDNESS error): valid programs set it.
    signs = (1,) if config.operands == "int8" else (0, 1)
    points += [f"matmul.{flag}={v}" for flag in ("switch", "accumulate") for v in (0, 1)]
    points += [f"matmul.signed={v}" for v in signs]
    points += [f"load_weights.signed={v}" for v in signs]
    if moves:
        points += [f"ub_to_weights.signed={v}" for v in signs]
        points += [f"ub_to_weights.transpose={v}" for v in (0, 1)]
        points += ["ub_to_weights.whole_tile", "ub_to_weights.part_tile"]
    points += [f"activate.func={f.name.lower()}" for f in activate_functions(config)]
    if table:
        points += ["load_table.every_extreme", "load_table.extreme_ends",
                   "setup.load_table_behind_activate",
                   "setup.activate_table_behind_load_table"]
    if config.sum_tables:
        points += [f"matmul_lookup.table={t}" for t in (0, 1)]
        points += [f"load_table.target=sum{t}" for t in (0, 1)]
        points += ["setup.sum_table_behind_lookup"]
    if config.row_scale:
        points += [f"normalise.{kind}" for kind in DIVISOR_KINDS]
        points += ["normalise.shift_clamped_at_63"]
    points += [f"activate.pool={p.name.lower()}" for p in isa.Pool]
    points += ["activate.longer_than_matmul_latency"]
    points += [f"{op}.slot.{end}" for op in ("activate", "load_params") for end in
               ("first", "last")]
    points += ["load_params.shift=0", "load_params.shift=63"]
    points += [f"load_params.rounding={r.name.lower()}" for r in isa.Rounding]
    points += ["load_params.column_shifts", "load_params.column_shift=0",
               "load_params.column_shift=63", "load_params.column_shift_tie_multiplier"]
    for op, memory in MEMORY_ACCESSES:
        if op == "ub_to_weights" and not moves:
            continue
        for point in ("first", "last", "single", "full"):
            if point != "full" or (_reachable_full(config, op, memory) and (
                    max_count is None or depths[memory] <= max_count)):
                points.append(f"{op}.{memory}.{point}")
    points += ["weight_queue.full", "weight_queue.drained",
               f"matmul.run_of_{config.matmul_slots + 1}"]
    points += ["reserved_fields_set"]
    if config.host_width > isa.INSTR_BITS:
        points += ["instr_bits_above_64"]
    points += ["data_bits_above_row"]
    if table and isa.TABLE_ENTRIES % (4 * config.cols):
        points += ["load_table.bits_past_entry_255"]
    points += [f"setup.{rule}" for rule in rules]
    points += ["setup.one_row_overlap", "setup.adjacent_no_overlap"]
    if rtl:
        points += [f"rtl.stall.{rule}" for rule in rules]
        points += [f"rtl.overlap.{a}+{b}" for a, b in OVERLAPS]
    return points


def observe_rtl(coverage: Coverage, counts: Mapping[str, Mapping[str, int]]) -> None:
    """Add what :meth:`~firmware.transports.rtl.RtlDevice.coverage` returned (cycles since
    the device's last reset)."""
    for rule, cycles in counts["stalls"].items():
        coverage.hit(f"rtl.stall.{rule}", cycles)
    for pair, cycles in counts["overlaps"].items():
        coverage.hit(f"rtl.overlap.{pair}", cycles)


def _reserved_mask(opcode: isa.Opcode) -> int:
    """The bits of ``opcode``'s reserved fields (the core ignores them)."""
    mask = 0
    for spec in field_specs(opcode):
        if spec.kind == "reserved":
            mask |= ((1 << spec.width) - 1) << spec.offset
    return mask


#: Per opcode, the bits of its instruction word's reserved fields.
RESERVED_BITS = {op: _reserved_mask(op) for op in isa.Opcode}


class ProgramObserver:
    """Counts the coverage points of host streams as the core would execute them.

    Stateful across programs, like the core: it follows the weight queue's length (for the
    queue points) from one program to the next, and on a core with the row scale runs the
    programs on an ISA simulator of its own (for the accumulators NORMALISE divides);
    :meth:`reset` forgets both with the device's reset.
    """

    def __init__(self, config: TPUConfig, coverage: Coverage):
        self.config = config
        self.coverage = coverage
        self.reset()

    def reset(self) -> None:
        self.queued = 0
        self._recent: dict[str, dict[str, tuple[int, int]]] = {}
        self._run = 0
        self._previous: isa.Opcode | None = None
        self._model = IsaSim(self.config) if self.config.row_scale else None

    def _boundaries(self, op: str, memory: str, lo: int, count: int) -> None:
        depth = {"ub": self.config.ub_depth, "acc": self.config.acc_depth,
                 "tile": self.config.weight_mem_tiles}[memory]
        hit = self.coverage.hit
        if lo == 0:
            hit(f"{op}.{memory}.first")
        if lo + count == depth:
            hit(f"{op}.{memory}.last")
        if count == 1:
            hit(f"{op}.{memory}.single")
        if count == depth:
            hit(f"{op}.{memory}.full")

    def _setups(self, op: str, ranges: dict[str, tuple[int, int]]) -> None:
        """Hazards this instruction sets up with the nearest earlier instruction of each kind
        (since the last fence)."""
        for rule, (waiter, w_mem, earlier, e_mem) in RULE_ACCESSES.items():
            if waiter != op or earlier not in self._recent:
                continue
            lo, hi = ranges[w_mem]
            e_lo, e_hi = self._recent[earlier][e_mem]
            if lo < e_hi and e_lo < hi:
                self.coverage.hit(f"setup.{rule}")
                if min(hi, e_hi) - max(lo, e_lo) == 1:
                    self.coverage.hit("setup.one_row_overlap")
            elif lo == e_hi or hi == e_lo:
                self.coverage.hit("setup.adjacent_no_overlap")

    def observe(self, beats: Sequence[int]) -> None:
        """Count the points of a valid host stream (whole instructions and their data)."""
        cfg = self.config
        hit = self.coverage.hit
        i = 0
        rows_bits = {"ub": 8 * cfg.ub_row, "tile": 8 * cfg.cols, "param": 32 * cfg.cols,
                     "table": 32 * cfg.cols}
        while i < len(beats):
            beat = int(beats[i])
            word = beat & _INSTR_MASK
            start = i
            i += 1
            if word == isa.RESYNC_WORD:
                hit("resync_word")
                self._run_model(beats[start:i])
                continue
            opcode, f = isa.decode(word)
            assert isinstance(opcode, isa.Opcode), f"beat {i - 1}: not an instruction"
            name = opcode.name.lower()
            hit(f"op.{name}")
            if word & RESERVED_BITS[opcode]:
                hit("reserved_fields_set")
            if beat >> isa.INSTR_BITS:
                hit("instr_bits_above_64")
            data_beats, row = 0, None
            ranges: dict[str, tuple[int, int]] = {}
            count = f.get("count", 0)
            if opcode in (isa.Opcode.READ_HOST, isa.Opcode.WRITE_HOST):
                ranges["ub"] = (f["ub_addr"], f["ub_addr"] + count)
                if opcode == isa.Opcode.READ_HOST:
                    data_beats, row = count, "ub"
            elif opcode == isa.Opcode.LOAD_WEIGHTS:
                ranges["tile"] = (f["tile"], f["tile"] + count)
                data_beats, row = count * cfg.rows, "tile"
                hit(f"load_weights.signed={int(f['signed'])}")
            elif opcode == isa.Opcode.READ_WEIGHTS:
                ranges["tile"] = (f["tile"], f["tile"] + count)
                self.queued += count
                if self.queued == cfg.weight_fifo_depth + 1:
                    hit("weight_queue.full")
            elif opcode in (isa.Opcode.MATMUL, isa.Opcode.MATMUL_LOOKUP):
                if opcode == isa.Opcode.MATMUL_LOOKUP:
                    hit(f"matmul_lookup.table={f['table']}")
                    name = "matmul"         # its ranges and hazards are a MATMUL's
                ranges["ub"] = (f["ub_addr"], f["ub_addr"] + count)
                ranges["acc"] = (f["acc_addr"], f["acc_addr"] + count)
                for flag in ("switch", "accumulate", "signed"):
                    hit(f"matmul.{flag}={int(f[flag])}")
                if f["switch"]:
                    self.queued -= 1
                    if self.queued == 0:
                        hit("weight_queue.drained")
            elif opcode == isa.Opcode.ACTIVATE:
                window = POOL_WINDOW[f["pool"]]
                ranges["acc"] = (f["acc_addr"], f["acc_addr"] + count)
                ranges["ub"] = (f["ub_addr"], f["ub_addr"] + count // window)
                hit(f"activate.func={f['func'].name.lower()}")
                if f["func"] == isa.Func.NORMALISE:
                    self._normalise(f["acc_addr"], count, f["slot"])
                if f["func"] == isa.Func.TABLE and self._previous == isa.Opcode.LOAD_TABLE:
                    hit("setup.activate_table_behind_load_table")
                hit(f"activate.pool={f['pool'].name.lower()}")
                if count > cfg.rows + cfg.cols + 4:
                    hit("activate.longer_than_matmul_latency")
                self._slot("activate", f["slot"])
            elif opcode == isa.Opcode.UB_TO_WEIGHTS:
                ranges["ub"] = (f["ub_addr"], f["ub_addr"] + count)
                ranges["tile"] = (f["tile"], f["tile"] + 1)
                hit(f"ub_to_weights.signed={int(f['signed'])}")
                hit(f"ub_to_weights.transpose={int(f['transpose'])}")
                whole = cfg.cols if f["transpose"] else cfg.rows
                hit("ub_to_weights.whole_tile" if count == whole else "ub_to_weights.part_tile")
            elif opcode == isa.Opcode.LOAD_TABLE and f["target"] != isa.TableTarget.ACTIVATION:
                hit(f"load_table.target={f['target'].name.lower()}")
                data_beats, row = isa.sum_table_beats(cfg.cols), "table"
                if self._previous == isa.Opcode.MATMUL_LOOKUP:
                    hit("setup.sum_table_behind_lookup")    # it waits until the core idles
            elif opcode == isa.Opcode.LOAD_TABLE:
                data_beats, row = isa.table_beats(cfg.cols), "table"
                self._table(beats[i:i + data_beats])
                if self._previous == isa.Opcode.ACTIVATE:
                    hit("setup.load_table_behind_activate")     # it waits for the ACTIVATE
            elif opcode == isa.Opcode.LOAD_PARAMS:
                data_beats, row = 2 + f["column_shifts"], "param"
                self._slot("load_params", f["slot"])
                hit(f"load_params.rounding={f['rounding'].name.lower()}")
                if f["column_shifts"]:
                    self._column_shifts(beats[i:i + data_beats])
                elif f["shift"] in (0, 63):
                    hit(f"load_params.shift={f['shift']}")
            for memory, (lo, hi) in ranges.items():
                if (name, memory) in MEMORY_ACCESSES:
                    self._boundaries(name, memory, lo, hi - lo)
            # Hazards set up with earlier instructions, then this one becomes the latest of
            # its kind (a fence forgets them all).
            if opcode in FENCES:
                self._recent.clear()
            elif ranges:
                self._setups(name, ranges)
                self._recent[name] = ranges
            self._run = self._run + 1 if name == "matmul" else 0
            self._previous = opcode
            if self._run == self.config.matmul_slots + 1:
                hit(f"matmul.run_of_{self.config.matmul_slots + 1}")
            for data in beats[i:i + data_beats]:
                if int(data) >> rows_bits[row]:
                    hit("data_bits_above_row")
            i += data_beats
            self._run_model(beats[start:i])

    def _run_model(self, beats: Sequence[int]) -> None:
        if self._model is None:
            return
        self._model.feed(beats)
        assert self._model.error == isa.ErrorCode.NONE, \
            f"the observer's ISA simulator stopped: {self._model.status}"

    def _normalise(self, acc: int, count: int, slot: int) -> None:
        """A NORMALISE of accumulator rows ``acc..acc+count-1`` with parameter slot ``slot``,
        before it runs: the kinds of divisor it meets, and whether a row's shift grown by
        the cut passes 63 (the clamp)."""
        if self._model is None:
            return
        shift = int(np.max(self._model.params[slot].shift))
        for d in self._model.acc[acc:acc + count, -1]:
            kind = _divisor_kind(int(d))
            if kind is not None:
                self.coverage.hit(f"normalise.{kind}")
            if shift + isa.reciprocal(int(d))[1] > 63:
                self.coverage.hit("normalise.shift_clamped_at_63")

    def _table(self, data: Sequence[int]) -> None:
        """A LOAD_TABLE's entries: the byte's extremes (0x00, 0x7f, 0x80, 0xff) all in the
        table, and at both ends (the entries of ``q`` = -128 and 127, the one written last);
        bits set past entry 255 in a partial last beat (ignored)."""
        hit = self.coverage.hit
        per_beat = 4 * self.config.cols
        if len(data) < isa.table_beats(self.config.cols):
            return
        entries = [(int(beat) >> (8 * k)) & 0xFF for beat in data for k in range(per_beat)]
        extremes = {0x00, 0x7F, 0x80, 0xFF}
        if extremes <= set(entries[:isa.TABLE_ENTRIES]):
            hit("load_table.every_extreme")
        if entries[0] in extremes and entries[isa.TABLE_ENTRIES - 1] in extremes:
            hit("load_table.extreme_ends")
        if any(entries[isa.TABLE_ENTRIES:]):
            hit("load_table.bits_past_entry_255")

    def _column_shifts(self, data: Sequence[int]) -> None:
        """Per-column shifts (the third beat): the extremes, and a multiplier that makes
        exact ties (``2**(s-1)`` at a column's shift ``s``, ``1 <= s <= 31``)."""
        hit = self.coverage.hit
        hit("load_params.column_shifts")
        if len(data) < 3:
            return
        lane = (1 << 32) - 1
        for j in range(self.config.cols):
            s = (int(data[2]) >> (32 * j)) & 63
            m = (int(data[1]) >> (32 * j)) & lane
            if s in (0, 63):
                hit(f"load_params.column_shift={s}")
            if 1 <= s <= 31 and m == 1 << (s - 1):
                hit("load_params.column_shift_tie_multiplier")

    def _slot(self, op: str, slot: int) -> None:
        if slot == 0:
            self.coverage.hit(f"{op}.slot.first")
        if slot == self.config.param_slots - 1:
            self.coverage.hit(f"{op}.slot.last")
