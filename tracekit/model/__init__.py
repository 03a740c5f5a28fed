"""Pure models of a training job under a parallel layout (no torch, no I/O): memory.py so far."""
