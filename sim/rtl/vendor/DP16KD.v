// Simulation model of the Lattice ECP5 DP16KD (18 Kbit true dual-port block RAM), for Icarus
// Verilog 11 and Verilator 5: the subset amtpu instantiates (hdl/block_ram.py,
// PipelinedMemory).
//
// Port and parameter names and defaults are those of yosys's share/ecp5/cells_bb.v, which
// yosys's synth_ecp5 and nextpnr-ecp5 use. (Yosys's own model, share/ecp5/cells_sim.v,
// models more of the cell; this one is small enough for Verilator to build the core's many
// blocks quickly, and it makes a colliding read visible, below.)
//
// Modelled:
//   both ports DATA_WIDTH_A = DATA_WIDTH_B = 18, 9, 4, 2 or 1 bits: 1024, 2048, 4096, 8192
//   or 16384 rows, the row address on AD[13:14-abits] (abits 10 to 14); at 18 bits AD[1:0]
//   enable the written row's 9-bit halves (AD0 bits 8:0, AD1 bits 17:9);
//   on a rising edge of CLKA (both ports are timed on CLKA: tie CLKB to the same clock)
//   with CEx high, a port writes DIx to its row when WEx is high (WRITEMODE "NORMAL": its
//   output latch keeps its row), else reads its row into its output latch; with OCEx high
//   the output register takes the latch; DOx is the output register with REGMODE_x
//   "OUTREG", the latch with "NOREG"; the rows, latches and registers start at 0 (INITVAL
//   and GSR are not modelled: the device clears them when configured, as here).
//   A port that reads the row the other port writes at the same edge gets an undefined row
//   on the part; here it gets the old row inverted, so a design that uses such a read
//   fails its test instead of passing by luck.
// Rejected with $fatal at time 0: widths that differ or are not one of the above, REGMODE
// other than NOREG/OUTREG, WRITEMODE other than NORMAL, CSDECODE other than 0b000.
// Rejected with $fatal at a CLKA edge: RSTx high or CSx not 000 (resets and chip selects
// are not modelled), both ports writing.

// Unused inputs and parameters, and string-parameter comparisons of unequal widths, are expected here.
// verilator lint_off UNUSEDSIGNAL
// verilator lint_off WIDTHEXPAND
// verilator lint_off UNUSEDPARAM
module DP16KD(DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7,
              DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0, ADA13, ADA12, ADA11, ADA10, ADA9,
              ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0, CEA, OCEA, CLKA, WEA,
              RSTA, CSA2, CSA1, CSA0, DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11,
              DOA10, DOA9, DOA8, DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0, DIB17,
              DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5,
              DIB4, DIB3, DIB2, DIB1, DIB0, ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7,
              ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0, CEB, OCEB, CLKB, WEB, RSTB, CSB2,
              CSB1, CSB0, DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9,
              DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0);
    parameter DATA_WIDTH_A = 18;
    parameter DATA_WIDTH_B = 18;
    parameter REGMODE_A = "NOREG";
    parameter REGMODE_B = "NOREG";
    parameter RESETMODE = "SYNC";
    parameter ASYNC_RESET_RELEASE = "SYNC";
    parameter CSDECODE_A = "0b000";
    parameter CSDECODE_B = "0b000";
    parameter WRITEMODE_A = "NORMAL";
    parameter WRITEMODE_B = "NORMAL";
    parameter GSR = "ENABLED";
    input DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6,
          DIA5, DIA4, DIA3, DIA2, DIA1, DIA0, ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7,
          ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0, CEA, OCEA, CLKA, WEA, RSTA, CSA2, CSA1,
          CSA0, DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7,
          DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0, ADB13, ADB12, ADB11, ADB10, ADB9, ADB8,
          ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0, CEB, OCEB, CLKB, WEB, RSTB, CSB2,
          CSB1, CSB0;
    output DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6,
           DOA5, DOA4, DOA3, DOA2, DOA1, DOA0, DOB17, DOB16, DOB15, DOB14, DOB13, DOB12,
           DOB11, DOB10, DOB9, DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0;

    localparam W = DATA_WIDTH_A;
    localparam ABITS = W == 18 ? 10 : W == 9 ? 11 : W == 4 ? 12 : W == 2 ? 13 : 14;
    localparam LOW = 14 - ABITS;

    // Parameters outside the subset stop the simulation before it starts.
    initial begin
        if (DATA_WIDTH_A != DATA_WIDTH_B)
            $fatal(1, "DP16KD model: DATA_WIDTH_A=%0d, DATA_WIDTH_B=%0d: must be equal",
                   DATA_WIDTH_A, DATA_WIDTH_B);
        if (W != 18 && W != 9 && W != 4 && W != 2 && W != 1)
            $fatal(1, "DP16KD model: DATA_WIDTH=%0d unsupported (18, 9, 4, 2 or 1)", W);
        if ((REGMODE_A != "NOREG" && REGMODE_A != "OUTREG") ||
                (REGMODE_B != "NOREG" && REGMODE_B != "OUTREG"))
            $fatal(1, "DP16KD model: REGMODE \"%0s\"/\"%0s\" unsupported (NOREG, OUTREG)",
                   REGMODE_A, REGMODE_B);
        if (WRITEMODE_A != "NORMAL" || WRITEMODE_B != "NORMAL")
            $fatal(1, "DP16KD model: WRITEMODE \"%0s\"/\"%0s\" unsupported (NORMAL)",
                   WRITEMODE_A, WRITEMODE_B);
        if (CSDECODE_A != "0b000" || CSDECODE_B != "0b000")
            $fatal(1, "DP16KD model: CSDECODE other than 0b000 unsupported");
    end

    wire [17:0] di_a = {DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8,
        DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0};
    wire [13:0] ad_a = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4,
        ADA3, ADA2, ADA1, ADA0};
    wire [2:0] cs_a = {CSA2, CSA1, CSA0};
    wire [17:0] di_b = {DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8,
        DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0};
    wire [13:0] ad_b = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4,
        ADB3, ADB2, ADB1, ADB0};
    wire [2:0] cs_b = {CSB2, CSB1, CSB0};

    reg [17:0] rows [0:(1 << ABITS) - 1];
    reg [17:0] latch_a, latch_b, oreg_a, oreg_b;
    wire [ABITS-1:0] row_a = ad_a[13:LOW];
    wire [ABITS-1:0] row_b = ad_b[13:LOW];
    wire write_a = CEA && WEA;
    wire write_b = CEB && WEB;
    // The bits a write changes: the port's width, at 18 bits the halves AD[1:0] enable.
    wire [17:0] mask_a = W == 18 ? {{9{ad_a[1]}}, {9{ad_a[0]}}} : (18'h1 << W) - 1;
    wire [17:0] mask_b = W == 18 ? {{9{ad_b[1]}}, {9{ad_b[0]}}} : (18'h1 << W) - 1;
    wire [17:0] width_mask = (18'h1 << W) - 1;
    wire [17:0] do_a = (REGMODE_A == "OUTREG" ? oreg_a : latch_a) & width_mask;
    wire [17:0] do_b = (REGMODE_B == "OUTREG" ? oreg_b : latch_b) & width_mask;
    assign {DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6,
           DOA5, DOA4, DOA3, DOA2, DOA1, DOA0} = do_a;
    assign {DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6,
           DOB5, DOB4, DOB3, DOB2, DOB1, DOB0} = do_b;

    integer i;
    initial begin
        for (i = 0; i < (1 << ABITS); i = i + 1)
            rows[i] = 18'h0;
        latch_a = 18'h0;
        latch_b = 18'h0;
        oreg_a = 18'h0;
        oreg_b = 18'h0;
    end

    always @(posedge CLKA) begin
        if (RSTA || RSTB)
            $fatal(1, "DP16KD model: RSTA/RSTB high at a clock edge (resets not modelled)");
        if (cs_a != 3'b000 || cs_b != 3'b000)
            $fatal(1, "DP16KD model: CSA/CSB not 000 at a clock edge (not modelled)");
        if (write_a && write_b)
            $fatal(1, "DP16KD model: both ports write at one edge (not modelled)");
        if (OCEA)
            oreg_a <= latch_a;
        if (OCEB)
            oreg_b <= latch_b;
        if (CEA && !WEA)
            latch_a <= (write_b && row_b == row_a) ? ~rows[row_a] : rows[row_a];
        if (CEB && !WEB)
            latch_b <= (write_a && row_a == row_b) ? ~rows[row_b] : rows[row_b];
        if (write_a)
            rows[row_a] <= (rows[row_a] & ~mask_a) | (di_a & mask_a);
        if (write_b)
            rows[row_b] <= (rows[row_b] & ~mask_b) | (di_b & mask_b);
    end
endmodule
