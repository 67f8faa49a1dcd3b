// Simulation model of the Lattice iCE40 SB_MAC16 (16x16 multiply-accumulate block), for
// Icarus Verilog 11 and Verilator 5: the subset amtpu instantiates, the dual 8x8 mode
// (hdl/dual_mult.py, multiplier="ice40").
//
// Port and parameter names, widths and defaults are those of yosys's share/ice40/cells_sim.v,
// which yosys's synth_ice40 and nextpnr-ice40 use. tests/hdl/test_dual_mult.py proves this
// model equal to that one, with yosys, for the parameters amtpu uses.
//
// Modelled (MODE_8x8 = 1, TOPOUTPUT_SELECT = BOTOUTPUT_SELECT = 2):
//   O[31:16] = A[15:8] * B[15:8] and O[15:0] = A[7:0] * B[7:0], 8 x 8 -> 16 bits, each
//   operand signed when A_SIGNED / B_SIGNED is set, else unsigned; A and B registered on the
//   rising edge of CLK when CE is high (and AHOLD / BHOLD low) if A_REG / B_REG is set; the
//   products registered likewise (when CE is high) if TOP_8x8_MULT_REG / BOT_8x8_MULT_REG
//   is set; a stage whose parameter is clear is a wire. The registers start at 0 (the device
//   clears them when it is configured).
// Rejected with $fatal at time 0: any other parameter value (the 16x16 multiplier and its
// pipeline registers, the C and D registers, the accumulators' output selections,
// NEG_TRIGGER).
// Rejected with $fatal at a CLK edge: a reset input (IRSTTOP, IRSTBOT, ORSTTOP, ORSTBOT)
// high (resets are not modelled).
// Not modelled, driven X: CO, ACCUMCO, SIGNEXTOUT (the adders are not used).

// Unused inputs are expected here.
// verilator lint_off UNUSEDSIGNAL
// verilator lint_off UNUSEDPARAM
module SB_MAC16 (
    input CLK, CE,
    input [15:0] C, A, B, D,
    input AHOLD, BHOLD, CHOLD, DHOLD,
    input IRSTTOP, IRSTBOT,
    input ORSTTOP, ORSTBOT,
    input OLOADTOP, OLOADBOT,
    input ADDSUBTOP, ADDSUBBOT,
    input OHOLDTOP, OHOLDBOT,
    input CI, ACCUMCI, SIGNEXTIN,
    output [31:0] O,
    output CO, ACCUMCO, SIGNEXTOUT
);
    parameter [0:0] NEG_TRIGGER = 0;
    parameter [0:0] C_REG = 0;
    parameter [0:0] A_REG = 0;
    parameter [0:0] B_REG = 0;
    parameter [0:0] D_REG = 0;
    parameter [0:0] TOP_8x8_MULT_REG = 0;
    parameter [0:0] BOT_8x8_MULT_REG = 0;
    parameter [0:0] PIPELINE_16x16_MULT_REG1 = 0;
    parameter [0:0] PIPELINE_16x16_MULT_REG2 = 0;
    parameter [1:0] TOPOUTPUT_SELECT = 0;
    parameter [1:0] TOPADDSUB_LOWERINPUT = 0;
    parameter [0:0] TOPADDSUB_UPPERINPUT = 0;
    parameter [1:0] TOPADDSUB_CARRYSELECT = 0;
    parameter [1:0] BOTOUTPUT_SELECT = 0;
    parameter [1:0] BOTADDSUB_LOWERINPUT = 0;
    parameter [0:0] BOTADDSUB_UPPERINPUT = 0;
    parameter [1:0] BOTADDSUB_CARRYSELECT = 0;
    parameter [0:0] MODE_8x8 = 0;
    parameter [0:0] A_SIGNED = 0;
    parameter [0:0] B_SIGNED = 0;

`ifndef SYNTHESIS   // yosys reads the model for the equivalence proof, without the checks
    // Parameters outside the subset stop the simulation before it starts.
    initial begin
        if (MODE_8x8 != 1'b1)
            $fatal(1, "SB_MAC16 model: MODE_8x8=%0d unsupported (1)", MODE_8x8);
        if (TOPOUTPUT_SELECT != 2'd2 || BOTOUTPUT_SELECT != 2'd2)
            $fatal(1, "SB_MAC16 model: TOPOUTPUT_SELECT=%0d, BOTOUTPUT_SELECT=%0d unsupported (2)",
                   TOPOUTPUT_SELECT, BOTOUTPUT_SELECT);
        if (PIPELINE_16x16_MULT_REG1 != 1'b0 || PIPELINE_16x16_MULT_REG2 != 1'b0)
            $fatal(1, "SB_MAC16 model: PIPELINE_16x16_MULT_REG1/2 unsupported (0)");
        if (C_REG != 1'b0 || D_REG != 1'b0)
            $fatal(1, "SB_MAC16 model: C_REG, D_REG unsupported (0)");
        if (NEG_TRIGGER != 1'b0)
            $fatal(1, "SB_MAC16 model: NEG_TRIGGER unsupported (0)");
    end

    always @(posedge CLK)
        if (IRSTTOP || IRSTBOT || ORSTTOP || ORSTBOT)
            $fatal(1, "SB_MAC16 model: a reset input is high (resets are not modelled)");
`endif

    reg [15:0] a_reg = 16'd0;
    reg [15:0] b_reg = 16'd0;
    reg [15:0] top_reg = 16'd0;
    reg [15:0] bot_reg = 16'd0;

    wire [15:0] a_op = A_REG ? a_reg : A;
    wire [15:0] b_op = B_REG ? b_reg : B;
    // Each 8-bit half extended to 16 bits as its block's signedness says.
    wire [15:0] a_hi = {{8{A_SIGNED & a_op[15]}}, a_op[15:8]};
    wire [15:0] a_lo = {{8{A_SIGNED & a_op[7]}}, a_op[7:0]};
    wire [15:0] b_hi = {{8{B_SIGNED & b_op[15]}}, b_op[15:8]};
    wire [15:0] b_lo = {{8{B_SIGNED & b_op[7]}}, b_op[7:0]};
    wire [15:0] top = a_hi * b_hi;
    wire [15:0] bot = a_lo * b_lo;

    always @(posedge CLK) begin
        if (CE) begin
            if (!AHOLD) a_reg <= A;
            if (!BHOLD) b_reg <= B;
            top_reg <= top;
            bot_reg <= bot;
        end
    end

    assign O = {TOP_8x8_MULT_REG ? top_reg : top, BOT_8x8_MULT_REG ? bot_reg : bot};
    assign CO = 1'bx;
    assign ACCUMCO = 1'bx;
    assign SIGNEXTOUT = 1'bx;
endmodule
