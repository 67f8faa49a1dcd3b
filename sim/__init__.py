"""Reference models and verification infrastructure for the amtpu gateware."""
