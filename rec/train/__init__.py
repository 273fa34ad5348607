"""The training job: model from the spec, DMP with the plan's ShardingPlan, pipelined training.

Everything here but ``config`` imports torch/torchrec; nothing on the planning path imports this
package.
"""
