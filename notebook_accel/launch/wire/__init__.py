"""What travels between the notebook and the ranks: the payload and its pickling, large
buffers through shared memory (the transport seam), the outcomes, a script as a payload."""
