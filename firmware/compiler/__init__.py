"""Compiler from a quantised model (an integer graph, :mod:`firmware.graph`) to programs for the
core.

:func:`compile_network` takes a model as an integer graph (:mod:`firmware.graph`; the layer
API's :class:`~firmware.quant.QuantisedNetwork` is written as one first), lowers it
(:mod:`~firmware.compiler.lowering`) and, where it is one chain of stages, plans the whole
network for one :class:`~hdl.config.TPUConfig` (:func:`compile_stages`): weight
tiles, parameter slots, unified-buffer and accumulator regions, and how many images go through
at a time. The result, :class:`CompiledNetwork`, gives a *setup* program that loads what stays
resident (weights and parameters when they fit, the constant frames of padded tensors) and, for
any number of quantised inputs, *batch* programs that stream the inputs in, run every stage with
activations kept in the unified buffer, and write the outputs back, the link's transfers
overlapping the array's work. :func:`firmware.runtime.run` runs them on a device.

Units and batches
-----------------
Images go through in *units* of ``unit`` images and *batches* of ``units`` units
(``batch_size = unit * units`` images). The first stage runs unit by unit: the host's rows of
unit ``n + 1`` go into one of two input buffers while the first stage's MATMULs read unit ``n``
from the other. The later stages run once per batch, over all its units, so a weight tile of a
later stage serves ``batch_size`` rows however small a unit is. A batch program holds several
batches; the last stage's output has two buffers, so the write-back of batch ``b`` overlaps
batch ``b + 1``.

On-chip layout
--------------
A tensor of ``P`` positions (``H * W``, 1 for a vector) and ``C`` channels is stored as ``G``
channel groups of ``g`` channels, unit by unit: unified-buffer row
``base + ((u * G + group) * P + position) * unit + image`` holds channels ``group * g ..`` of
one position of image ``image`` of unit ``u`` (element 0 first). Stage outputs use
``g = min(rows, cols)`` (ACTIVATE writes ``cols`` elements and MATMUL reads ``rows``) and the
network's last stage ``g = cols``. A tensor that a padded convolution reads is stored inside a
frame of the padding's width whose rows hold the quantised zero; the setup program writes the
frames of tensors that have rows of their own, which no later instruction touches.

Buffer layout
-------------
A tensor takes ``G * P * unit * blocks`` rows (``P`` counting the frame; ``blocks`` the units
of a batch, one more for the first stage's spare block, two buffers for the last stage's
output); the input ring takes ``max(in_rows, ceil(ring * in_rows))``. The plan tries three
layouts (:data:`~firmware.compiler.plan.MODES`) and keeps the first that fits ``ub_depth``:

- ``resident``: the ring from row 0, then every stage's output in rows of its own;
- ``reuse``: the ring, the first stage's output (if it has the spare block) and the last
  stage's two buffers in rows of their own; the other stage outputs each live only from the
  stage that writes it to the one that reads it, so they alternate between the bottom and the
  top of the rows left, and need the largest sum of two neighbours' rows;
- ``sequential``: the batches run one after another (the next batch's input waits for the
  last one's write-back), so the ring and every stage output (the last with one buffer)
  alternate between the bottom and the top of the whole buffer: the largest sum of an
  input's and its stage output's rows must fit (the layout of the first compiler).

A tensor that shares rows with another has its frame written again before each batch's stage
writes it. :func:`compile_network` considers the sharing layouts only when one image does not
fit the resident one (their frames cost link rows), and its refusal names the tensors' rows.

Stages
------
A stage is ``Y = act(requantise(X @ W))`` with optional 2x2 max-pooling. It runs as *passes*:
each pass is one weight tile (``rows x cols``, zero-padded) times one unified-buffer row per
accumulator row, the passes of a stage accumulating. An accumulator row is one output position
of one image (four in a row, one pooling window, when max-pooling is fused: ACTIVATE's MAX4
pools four consecutive rows). Where the rows a pass reads are consecutive in the unified
buffer, one MATMUL streams them; the compiler orders accumulator rows so that they are. A pass
whose weight tile is all zero for a column block adds nothing and is left out for that block
(a depthwise convolution, lowered as a dense one with zeros between an output channel and the
input channels of other groups, keeps only the passes of its own channel group).

- Dense on the network input: one pass per ``rows`` input features.
- Dense after a spatial tensor (a Flatten): one pass per (position, channel group), weight
  rows in the HWC flatten order.
- Conv2D on the network input otherwise: the image crosses the link once, one row per position, and
  the row's spare elements carry the position's neighbours (as many kernel taps as fit,
  ``rows // C``), so one pass covers several kernel taps. A tap that no row holds is read from
  a row further on (a *shifted* pass: the taps of position ``p + d`` are taps of ``p``), so the
  host lays out a few positions past the output's edge (their outputs are not activated); only
  when no shift reaches a tap does another row per position cross the link.
- Conv2D on the network input, on a core with MATMUL's window mode
  (:attr:`~hdl.config.TPUConfig.conv_windows`), not max-pooled, ``C * stride <= 15``: the
  image crosses the link as the tensor itself (:class:`~firmware.compiler.layout._HostTensor`:
  framed by the padding in its zero point, packed ``ub_row`` elements a row, one image a
  unit), and each pass (a kernel row and a chunk of ``rows`` of its ``kw * C`` elements) is
  window MATMULs of step ``C * stride``: one along the framed width at stride 1 (the
  positions past the output's edge computed and not activated), one per output row at a
  larger stride. ``compile_network(..., windows=False)`` takes the host's rows below;
  ``windows=True`` takes the windows under a max-pool too (two rows a MATMUL: MAX4's four
  positions must be consecutive accumulator rows).
- Conv2D on the network input that a Dense reads, with few output channels: ``p``
  positions to an accumulator row (:class:`~firmware.compiler.layout._PairedConv`), the
  largest ``p`` whose ``p * n`` channels fit the ``min(rows, cols)`` output columns, whose
  wide kernel (the taps of ``p`` positions, ``spacing * stride`` apart) fits a row of
  ``rows`` and which divides the output's width. The host's row carries the wide kernel's
  taps and one pass computes the ``p`` positions, so the convolution streams ``1 / p`` of
  the array rows and the host sends ``1 / p`` of the rows. With max-pooling the positions
  are 2 apart (``spacing``), so MAX4's four rows pool ``p`` windows side by side; the
  output holds ``p`` positions a row, the same HWC order the Dense reads.
  ``compile_network(..., pack_positions=False)`` keeps one position a row.
- Conv2D on another stage's output runs on chip, TPU v1's way: one pass per kernel position
  and channel group, reading the input shifted by that position's offset. With stride 1 and
  no pooling, the rows that wrap around the frame's edge (``kw - 1`` per image row) are
  computed and not activated, so each pass is one MATMUL; with a stride or max-pooling each
  output position's rows are a MATMUL of their own (a unit's images are consecutive).

A residual add (:attr:`firmware.quant.Stage.skip`, a TFLite ADD of the previous stage's output
and an earlier stage's) is a 1x1 convolution of identity weights over its input whose passes
are MATMUL_LOOKUPs of sum table 1, after the same passes over the skip tensor (read through
its own frame and pitch) with table 0: the accumulators hold ``T0[a] + T1[x]``, each input's
TFLite term, and the ACTIVATE requantises the sum (an onnxruntime QLinearAdd, which adds in
float32: tables fitted to its results on every pair of bytes, :mod:`~firmware.compiler.sums`).
The setup program loads the two tables where
every add of the chain has the same; where they differ, each batch loads each add's before its
lookups (a sum-table LOAD_TABLE waits until the core is idle). A skip tensor is live from its
stage to the add (in the sharing layouts, rows of its own), and a first stage's output that an
add reads keeps two batches' blocks where it has the spare block, so that the next batch's
first stage never writes a block this batch's add has still to read.

Each stage's accumulator rows are split into jobs of a quarter of the accumulators (half where
a pooling window needs it). A job's ACTIVATE is *released* once the next job of its stage has a
MATMUL queued (it waits for its own MATMULs, and the array has work meanwhile), and sent earlier
when a MATMUL is about to read its output or write its accumulator rows; jobs take accumulator
rows around the whole memory, clear of the ACTIVATEs not yet sent. The later stages of a batch
are interleaved one per job of the next batch's first stage. The host's rows are sent between
MATMULs into input rows no MATMUL still reads; a MATMUL about to read rows not yet sent has them
sent first. READ_WEIGHTS run ahead of the MATMULs by the weight FIFO's depth plus the shadow
tile, consecutive resident tiles in one instruction. Weights stay resident (loaded once by the
setup program) when all tiles fit ``weight_mem_tiles``; otherwise the tiles a batch switches
to most (the first stage's, which every unit uses, then the others in order; all-zero tiles
none) take all but :data:`~firmware.compiler.network.STREAM_SLOTS` slots, loaded once too,
and every batch program streams only the rest through those slots as a ring. Parameters stay
resident when every (stage, column block) fits ``param_slots``; otherwise an ACTIVATE whose set
is not in a slot is preceded by
its LOAD_PARAMS into the slot used longest ago. The hardware interlocks order the rest (no NOP
padding, no SYNC).

Timing
------
The emitter keeps a cycle model of the core (:class:`~.timing._Timing`: the front end issuing
in order, the matrix engine one MATMUL ahead of the array, the activation engine one ACTIVATE
at a time, the hazard rules on the rows each instruction touches; its constants measured on the
RTL). The front end holds each instruction until the interlocks and its engine let it go, and
while it holds one, no later MATMUL reaches the array. So a released ACTIVATE (with its
LOAD_PARAMS) and the write-back go only when the model says the front end would issue them
before the array runs out of queued rows, and between MATMULs the host's rows go only as many
as the front end can send in that time (ACTIVATE's output rows share the unified buffer's write
port with them). The unit, the batch and the input ring are chosen by the model's cycles for a
batch in a long program (what a third batch adds to a program of two).

Shape bound
-----------
:meth:`CompiledNetwork.bounds` gives each stage's *shape bound*: its useful MACs over the MAC
slots its passes issue (``rows x cols`` for each accumulator row of each pass), which is the
array utilisation the stage reaches if the array never waits. What is lost below it is
scheduling (waits for the link, the weights, the interlocks); what is lost above it is the
layer's shape on this array.

Modules
-------
Each imports only the ones above it in this list:

- :mod:`~firmware.compiler.layout`: :class:`CompileError`, tensors in the unified buffer,
  each stage's layout (its passes), the weight tiles and parameter sets;
- :mod:`~firmware.compiler.plan`: the plan (the input ring, the stage outputs, the tile
  ids) and the cutting of a stage's rows into MATMULs and jobs;
- :mod:`~firmware.compiler.timing`: the cycle model (:class:`~.timing._Timing`);
- :mod:`~firmware.compiler.emitter`: the batch programs (:class:`~.emitter._Emitter`);
- :mod:`~firmware.compiler.network`: :class:`CompiledNetwork` and :func:`compile_stages`, the
  chain of stages in one program;
- :mod:`~firmware.compiler.attention`, :mod:`~firmware.compiler.attention_block`: attention's
  programs (``q @ k.T``, ``p @ v``, the whole block);
- :mod:`~firmware.compiler.sums`: a residual add's sum tables (TFLite's terms, or tables
  fitted to an elementwise function of two bytes);
- :mod:`~firmware.compiler.chain`: the runs of a graph's operators that compile into one
  program of stages, and the core steps (:class:`~firmware.compiler.chain.CoreStep`);
- :mod:`~firmware.compiler.lowering`: a graph (:mod:`firmware.graph`) as core and host steps,
  and :func:`compile_network`, the entry for a model that runs as one program.
"""

from firmware.compiler.layout import CompileError, StageBound
from firmware.compiler.layout import Tensor as Tensor
from firmware.compiler.lowering import compile_network
from firmware.compiler.network import PROGRAM_IMAGES, CompiledNetwork, compile_stages
from firmware.compiler.network import RINGS as RINGS
from firmware.compiler.network import TRIAL_BATCHES as TRIAL_BATCHES
from firmware.compiler.plan import COUNT_LIMIT

__all__ = ["CompileError", "CompiledNetwork", "StageBound", "compile_network", "compile_stages",
           "COUNT_LIMIT", "PROGRAM_IMAGES"]
