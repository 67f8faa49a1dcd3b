// Differential bench for sim/models/SB_MAC16.v (module renamed ours_SB_MAC16 by the test)
// against yosys's share/ice40/cells_sim.v SB_MAC16, same parameters: every pair of 8-bit
// operands in both halves at once (65,536 steps), then random operands, clock enables and
// holds. Prints "MISMATCHES <n>". tests/hdl/test_dual_mult.py builds and runs it.
`timescale 1ns/1ps
module sb_mac16_equiv;
  parameter A_REG = 1, B_REG = 1, OUT_REG = 1, A_SIGNED = 1, B_SIGNED = 1, MODE = 1;
  reg CLK = 0, CE = 0, AHOLD = 0, BHOLD = 0;
  reg [15:0] A = 0, B = 0;
  wire [31:0] ours, theirs;
  `define PARAMS .A_REG(A_REG[0]), .B_REG(B_REG[0]), .TOP_8x8_MULT_REG(OUT_REG[0]), \
      .BOT_8x8_MULT_REG(OUT_REG[0]), .TOPOUTPUT_SELECT(2'd2), .BOTOUTPUT_SELECT(2'd2), \
      .MODE_8x8(MODE[0]), .A_SIGNED(A_SIGNED[0]), .B_SIGNED(B_SIGNED[0])
  `define PORTS .CLK(CLK), .CE(CE), .A(A), .B(B), .C(16'd0), .D(16'd0), .AHOLD(AHOLD), \
      .BHOLD(BHOLD), .CHOLD(1'b0), .DHOLD(1'b0), .IRSTTOP(1'b0), .IRSTBOT(1'b0), \
      .ORSTTOP(1'b0), .ORSTBOT(1'b0), .OLOADTOP(1'b0), .OLOADBOT(1'b0), .ADDSUBTOP(1'b0), \
      .ADDSUBBOT(1'b0), .OHOLDTOP(1'b0), .OHOLDBOT(1'b0), .CI(1'b0), .ACCUMCI(1'b0), \
      .SIGNEXTIN(1'b0)
  ours_SB_MAC16 #(`PARAMS) u_ours(`PORTS, .O(ours));
  SB_MAC16 #(`PARAMS) u_theirs(`PORTS, .O(theirs));
  integer i, bad = 0, seed = 1;
  initial begin
    // yosys's model starts its registers X: clear them through the pipeline first.
    CE = 1;
    for (i = 0; i < 3; i = i + 1) begin #1 CLK = 1; #1 CLK = 0; end
    for (i = 0; i < 65536 + 8192; i = i + 1) begin
      if (i < 65536) begin
        // Low half: A[7:0] = i[15:8], B[7:0] = i[7:0]; high half the other way round.
        A = {i[7:0], i[15:8]}; B = {i[15:8], i[7:0]};
      end else begin
        A = $random(seed); B = $random(seed); CE = $random(seed);
        AHOLD = $random(seed); BHOLD = $random(seed);
      end
      #1 CLK = 1; #1 CLK = 0;
      if (ours !== theirs) begin
        bad = bad + 1;
        if (bad <= 4) $display("step %0d: A %h B %h: model %h, yosys %h", i, A, B, ours, theirs);
      end
    end
    $display("MISMATCHES %0d", bad);
    $finish;
  end
endmodule
