"""shardflow's library: specs, topologies, cost model, plan search and plans.

Importing ``rec`` starts no server, reads no environment and imports no torch.
"""
