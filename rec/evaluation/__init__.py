"""Model quality on held-out data: each metric one module (``auc``, ``logloss``, ``ne``), listed in
``metrics.METRICS``; computed exactly over every sample (numpy, no torch)."""
