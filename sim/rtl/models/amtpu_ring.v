// Memory of one ring of the simulation-only host bridge (sim/rtl/host_bridge.py), for Icarus
// Verilog 11 and Verilator 5: one write port and one registered read port on one clock, the
// read not transparent (a read of the row written at the same edge returns the old row), and
// no initial contents.
//
// Why a Verilog module and not an Amaranth memory: Amaranth writes every memory's initial
// contents into the netlist, 4096 zero rows per ring, and converting those took as long as
// converting the 2x2 core inside the bridge. The host writes every row before the bridge
// reads it, so nothing ever sees the contents at time 0.
//
// The rows are `mem`, which the host reaches through the simulator's VPI
// (sim/rtl/server.py); the bridge's Verilator build makes exactly it public.
module amtpu_ring #(
    parameter integer WIDTH = 8,
    parameter integer ABITS = 4
) (
    input  wire             clk,
    input  wire             wen,
    input  wire [ABITS-1:0] waddr,
    input  wire [WIDTH-1:0] wdata,
    input  wire [ABITS-1:0] raddr,
    output reg  [WIDTH-1:0] rdata
);
    reg [WIDTH-1:0] mem [0:(1 << ABITS) - 1];

    always @(posedge clk) begin
        if (wen)
            mem[waddr] <= wdata;
        rdata <= mem[raddr];
    end
endmodule
