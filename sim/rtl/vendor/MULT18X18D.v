// Simulation model of the Lattice ECP5 MULT18X18D (18x18 multiplier), for Icarus Verilog 11
// and Verilator 5: the subset amtpu instantiates (hdl/pe.py, multiplier="ecp5").
//
// Port and parameter names and defaults are those of yosys's share/ecp5/cells_bb.v, which
// yosys's synth_ecp5 and nextpnr-ecp5 use; yosys has no simulation model of this cell.
//
// Modelled:
//   P = A * B, 36 bits, each operand signed when SIGNEDA / SIGNEDB is high, else unsigned;
//   A and B registered on the rising edge of CLK0 when CE0 is high, if REG_INPUTA_CLK /
//   REG_INPUTB_CLK is "CLK0"; the product registered likewise if REG_OUTPUT_CLK is "CLK0";
//   a register stage whose *_CLK is "NONE" is a wire. The registers start at 0 (the device
//   clears them when it is configured).
// Rejected with $fatal at time 0: any other parameter value (other clocks, clock enables or
// resets, the pipeline register, REG_INPUTC_CLK, MULT_BYPASS, cascading, HIGHSPEED_CLK,
// SOURCEB_MODE, RESETMODE, CLKn_DIV; GSR may be "ENABLED" or "DISABLED").
// Rejected with $fatal at a CLK0 edge: RST0 high (resets are not modelled), SOURCEA or
// SOURCEB high (the shift inputs SRIA/SRIB are not modelled), SIGNEDA or SIGNEDB changing
// (the register stage a change takes effect in is not modelled: tie them); in Icarus also
// CE0 open and RST0, SOURCEA or SOURCEB X.
// Not modelled, driven X: SROA, SROB, ROA, ROB, ROC, SIGNEDP, and P[35:0] from C.

// Unused inputs and string-parameter comparisons of unequal widths are expected here.
// verilator lint_off UNUSEDSIGNAL
// verilator lint_off WIDTHEXPAND
module MULT18X18D(A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2,
                  A1, A0, B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4,
                  B3, B2, B1, B0, C17, C16, C15, C14, C13, C12, C11, C10, C9, C8, C7, C6,
                  C5, C4, C3, C2, C1, C0, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK3, CLK2,
                  CLK1, CLK0, CE3, CE2, CE1, CE0, RST3, RST2, RST1, RST0, SRIA17, SRIA16,
                  SRIA15, SRIA14, SRIA13, SRIA12, SRIA11, SRIA10, SRIA9, SRIA8, SRIA7,
                  SRIA6, SRIA5, SRIA4, SRIA3, SRIA2, SRIA1, SRIA0, SRIB17, SRIB16, SRIB15,
                  SRIB14, SRIB13, SRIB12, SRIB11, SRIB10, SRIB9, SRIB8, SRIB7, SRIB6,
                  SRIB5, SRIB4, SRIB3, SRIB2, SRIB1, SRIB0, SROA17, SROA16, SROA15, SROA14,
                  SROA13, SROA12, SROA11, SROA10, SROA9, SROA8, SROA7, SROA6, SROA5, SROA4,
                  SROA3, SROA2, SROA1, SROA0, SROB17, SROB16, SROB15, SROB14, SROB13,
                  SROB12, SROB11, SROB10, SROB9, SROB8, SROB7, SROB6, SROB5, SROB4, SROB3,
                  SROB2, SROB1, SROB0, ROA17, ROA16, ROA15, ROA14, ROA13, ROA12, ROA11,
                  ROA10, ROA9, ROA8, ROA7, ROA6, ROA5, ROA4, ROA3, ROA2, ROA1, ROA0, ROB17,
                  ROB16, ROB15, ROB14, ROB13, ROB12, ROB11, ROB10, ROB9, ROB8, ROB7, ROB6,
                  ROB5, ROB4, ROB3, ROB2, ROB1, ROB0, ROC17, ROC16, ROC15, ROC14, ROC13,
                  ROC12, ROC11, ROC10, ROC9, ROC8, ROC7, ROC6, ROC5, ROC4, ROC3, ROC2,
                  ROC1, ROC0, P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24,
                  P23, P22, P21, P20, P19, P18, P17, P16, P15, P14, P13, P12, P11, P10, P9,
                  P8, P7, P6, P5, P4, P3, P2, P1, P0, SIGNEDP);

    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTA_CE = "CE0";
    parameter REG_INPUTA_RST = "RST0";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_INPUTB_CE = "CE0";
    parameter REG_INPUTB_RST = "RST0";
    parameter REG_INPUTC_CLK = "NONE";
    parameter REG_INPUTC_CE = "CE0";
    parameter REG_INPUTC_RST = "RST0";
    parameter REG_PIPELINE_CLK = "NONE";
    parameter REG_PIPELINE_CE = "CE0";
    parameter REG_PIPELINE_RST = "RST0";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter REG_OUTPUT_CE = "CE0";
    parameter REG_OUTPUT_RST = "RST0";
    parameter CLK0_DIV = "ENABLED";
    parameter CLK1_DIV = "ENABLED";
    parameter CLK2_DIV = "ENABLED";
    parameter CLK3_DIV = "ENABLED";
    parameter HIGHSPEED_CLK = "NONE";
    parameter GSR = "ENABLED";
    parameter CAS_MATCH_REG = "FALSE";
    parameter SOURCEB_MODE = "B_SHIFT";
    parameter MULT_BYPASS = "DISABLED";
    parameter RESETMODE = "SYNC";

    input A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0,
          B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0,
          C17, C16, C15, C14, C13, C12, C11, C10, C9, C8, C7, C6, C5, C4, C3, C2, C1, C0,
          SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0,
          RST3, RST2, RST1, RST0, SRIA17, SRIA16, SRIA15, SRIA14, SRIA13, SRIA12, SRIA11,
          SRIA10, SRIA9, SRIA8, SRIA7, SRIA6, SRIA5, SRIA4, SRIA3, SRIA2, SRIA1, SRIA0,
          SRIB17, SRIB16, SRIB15, SRIB14, SRIB13, SRIB12, SRIB11, SRIB10, SRIB9, SRIB8,
          SRIB7, SRIB6, SRIB5, SRIB4, SRIB3, SRIB2, SRIB1, SRIB0;
    output SROA17, SROA16, SROA15, SROA14, SROA13, SROA12, SROA11, SROA10, SROA9, SROA8,
           SROA7, SROA6, SROA5, SROA4, SROA3, SROA2, SROA1, SROA0, SROB17, SROB16, SROB15,
           SROB14, SROB13, SROB12, SROB11, SROB10, SROB9, SROB8, SROB7, SROB6, SROB5,
           SROB4, SROB3, SROB2, SROB1, SROB0, ROA17, ROA16, ROA15, ROA14, ROA13, ROA12,
           ROA11, ROA10, ROA9, ROA8, ROA7, ROA6, ROA5, ROA4, ROA3, ROA2, ROA1, ROA0, ROB17,
           ROB16, ROB15, ROB14, ROB13, ROB12, ROB11, ROB10, ROB9, ROB8, ROB7, ROB6, ROB5,
           ROB4, ROB3, ROB2, ROB1, ROB0, ROC17, ROC16, ROC15, ROC14, ROC13, ROC12, ROC11,
           ROC10, ROC9, ROC8, ROC7, ROC6, ROC5, ROC4, ROC3, ROC2, ROC1, ROC0, P35, P34,
           P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20, P19, P18,
           P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2, P1, P0,
           SIGNEDP;

    // Parameters outside the subset stop the simulation before it starts.
    initial begin
        if (REG_INPUTA_CLK != "NONE" && REG_INPUTA_CLK != "CLK0")
            $fatal(1, "MULT18X18D model: REG_INPUTA_CLK=\"%0s\" unsupported (NONE or CLK0)",
                   REG_INPUTA_CLK);
        if (REG_INPUTB_CLK != "NONE" && REG_INPUTB_CLK != "CLK0")
            $fatal(1, "MULT18X18D model: REG_INPUTB_CLK=\"%0s\" unsupported (NONE or CLK0)",
                   REG_INPUTB_CLK);
        if (REG_OUTPUT_CLK != "NONE" && REG_OUTPUT_CLK != "CLK0")
            $fatal(1, "MULT18X18D model: REG_OUTPUT_CLK=\"%0s\" unsupported (NONE or CLK0)",
                   REG_OUTPUT_CLK);
        if (REG_PIPELINE_CLK != "NONE")
            $fatal(1, "MULT18X18D model: REG_PIPELINE_CLK=\"%0s\" unsupported (NONE)",
                   REG_PIPELINE_CLK);
        if (REG_INPUTC_CLK != "NONE")
            $fatal(1, "MULT18X18D model: REG_INPUTC_CLK=\"%0s\" unsupported (NONE)",
                   REG_INPUTC_CLK);
        if (REG_INPUTA_CE != "CE0" || REG_INPUTB_CE != "CE0" || REG_INPUTC_CE != "CE0" ||
                REG_PIPELINE_CE != "CE0" || REG_OUTPUT_CE != "CE0")
            $fatal(1, "MULT18X18D model: REG_*_CE other than CE0 unsupported");
        if (REG_INPUTA_RST != "RST0" || REG_INPUTB_RST != "RST0" || REG_INPUTC_RST != "RST0" ||
                REG_PIPELINE_RST != "RST0" || REG_OUTPUT_RST != "RST0")
            $fatal(1, "MULT18X18D model: REG_*_RST other than RST0 unsupported");
        if (CLK0_DIV != "ENABLED" || CLK1_DIV != "ENABLED" || CLK2_DIV != "ENABLED" ||
                CLK3_DIV != "ENABLED" || HIGHSPEED_CLK != "NONE")
            $fatal(1, "MULT18X18D model: CLKn_DIV, HIGHSPEED_CLK: only the defaults");
        if (GSR != "ENABLED" && GSR != "DISABLED")
            $fatal(1, "MULT18X18D model: GSR=\"%0s\" unsupported (ENABLED or DISABLED)", GSR);
        if (CAS_MATCH_REG != "FALSE" || SOURCEB_MODE != "B_SHIFT" ||
                MULT_BYPASS != "DISABLED" || RESETMODE != "SYNC")
            $fatal(1, "MULT18X18D model: CAS_MATCH_REG, SOURCEB_MODE, MULT_BYPASS, RESETMODE: %s",
                   "only the defaults");
    end

    wire [17:0] a = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1,
                     A0};
    wire [17:0] b = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1,
                     B0};

    reg [17:0] a_reg;
    reg [17:0] b_reg;
    reg [35:0] p_reg;
    initial begin
        a_reg = 18'd0;
        b_reg = 18'd0;
        p_reg = 36'd0;
    end

    wire [17:0] a_op = (REG_INPUTA_CLK == "NONE") ? a : a_reg;
    wire [17:0] b_op = (REG_INPUTB_CLK == "NONE") ? b : b_reg;
    // 19-bit operands: bit 18 is the sign when the operand is signed, else 0.
    wire signed [18:0] a_ext = {SIGNEDA & a_op[17], a_op};
    wire signed [18:0] b_ext = {SIGNEDB & b_op[17], b_op};
    wire signed [37:0] product = a_ext * b_ext;
    wire [35:0] p = (REG_OUTPUT_CLK == "NONE") ? product[35:0] : p_reg;

    always @(posedge CLK0) begin
        if (CE0) begin
            a_reg <= a;
            b_reg <= b;
            p_reg <= product[35:0];
        end
    end

    // Inputs the model does not follow must stay at the values it assumes.
    reg signeda_0;
    reg signedb_0;
    reg signed_seen;
    initial signed_seen = 1'b0;
    always @(posedge CLK0) begin
`ifndef VERILATOR
        // Four-state checks: Verilator has two states (an open or X input reads 0 there).
        if (CE0 === 1'bz)
            $fatal(1, "MULT18X18D model: CE0 must be driven");
        if (RST0 === 1'bx || SOURCEA === 1'bx || SOURCEB === 1'bx)
            $fatal(1, "MULT18X18D model: RST0, SOURCEA, SOURCEB must not be X");
`endif
        if (RST0 === 1'b1)
            $fatal(1, "MULT18X18D model: RST0 must be low or open (resets are not modelled)");
        if (SOURCEA === 1'b1 || SOURCEB === 1'b1)
            $fatal(1, "MULT18X18D model: SOURCEA/SOURCEB must be low or open (%s)",
                   "SRIA/SRIB are not modelled");
        if (signed_seen && (SIGNEDA !== signeda_0 || SIGNEDB !== signedb_0))
            $fatal(1, "MULT18X18D model: SIGNEDA/SIGNEDB must not change");
        signeda_0 <= SIGNEDA;
        signedb_0 <= SIGNEDB;
        signed_seen <= 1'b1;
    end

    assign {P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20, P19,
            P18, P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2, P1,
            P0} = p;
    assign {SROA17, SROA16, SROA15, SROA14, SROA13, SROA12, SROA11, SROA10, SROA9, SROA8, SROA7,
            SROA6, SROA5, SROA4, SROA3, SROA2, SROA1, SROA0} = 18'bx;
    assign {SROB17, SROB16, SROB15, SROB14, SROB13, SROB12, SROB11, SROB10, SROB9, SROB8, SROB7,
            SROB6, SROB5, SROB4, SROB3, SROB2, SROB1, SROB0} = 18'bx;
    assign {ROA17, ROA16, ROA15, ROA14, ROA13, ROA12, ROA11, ROA10, ROA9, ROA8, ROA7, ROA6,
            ROA5, ROA4, ROA3, ROA2, ROA1, ROA0} = 18'bx;
    assign {ROB17, ROB16, ROB15, ROB14, ROB13, ROB12, ROB11, ROB10, ROB9, ROB8, ROB7, ROB6,
            ROB5, ROB4, ROB3, ROB2, ROB1, ROB0} = 18'bx;
    assign {ROC17, ROC16, ROC15, ROC14, ROC13, ROC12, ROC11, ROC10, ROC9, ROC8, ROC7, ROC6,
            ROC5, ROC4, ROC3, ROC2, ROC1, ROC0} = 18'bx;
    assign SIGNEDP = 1'bx;
endmodule
// verilator lint_on WIDTHEXPAND
// verilator lint_on UNUSEDSIGNAL
