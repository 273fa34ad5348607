"""The bottom layer of settings every room above reads: the cost model's settings
(``rec.config.cost``: ``CostConfig``, ``Optimizer``), the search's (``rec.config.search``:
``SearchConfig``) and what made a plan (``rec.config.planner_identity``: ``PlannerIdentity``,
``Planner``, ``MadeBy``). It imports nothing of ``rec`` above ``rec.settings``, ``rec.sharding`` and
``rec.profile``, so the plan value, the cost model and the search all import it and none of them
imports another for a setting. The integer codes of sharding types and kernels live with the
enums, in ``rec.sharding``."""
