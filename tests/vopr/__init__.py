"""The whole-node simulator (``tests/vopr/sim.py``): real Raft hosts and stream groups on
simulated time, network, disks and clocks, one seed driving it all."""
