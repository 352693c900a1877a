"""``ShardedState``: an FSDP2 model and its optimizer, elastic in place (``docs/sharded.md``)."""
