"""torch_xla registers the "xla" torch.distributed backend here; the stand-in has none."""
