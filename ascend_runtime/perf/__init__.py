"""Performance model of the PD stages (closed form on the simulator's calibrated timing)."""
