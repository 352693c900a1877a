"""The elastic driver: discovery, host ordering and blacklisting, slots, decisions."""
