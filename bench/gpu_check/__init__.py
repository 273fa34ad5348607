"""``python -m bench.gpu_check``: shardflow's cuda path checked on any GPU machine (docs/gpu.md)."""
