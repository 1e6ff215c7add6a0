"""Pure Raft core: no IO, no asyncio, no clock, no global randomness."""
