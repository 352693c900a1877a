"""The rendezvous service: one aiohttp process serving rounds and notices to many jobs."""
