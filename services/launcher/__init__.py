"""`tiermesh run`'s supervisor: starts the tiers, the router and (with --mesh) the xDS control
plane as child processes on this machine, waits for their health, stops them on a signal. It
speaks to them only through processes and gRPC health: no torch, no router or engine code."""
