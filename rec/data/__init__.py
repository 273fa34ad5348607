"""Training data: where it is (``files``), what it must look like (``layout``, ``schema``), how ids
out of range are treated (``ids``), how ranks share it and in what order (``order``), and how rows
become numpy batches (``columns``, ``parquet``, ``synthetic``). Torch-free: the training job turns
these batches into TorchRec's (``rec.train.input``); the checks before launch use them as they are.
"""
