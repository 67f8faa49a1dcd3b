"""Host-side software: assembler, compiler, quantiser, runtime and transports."""
