"""One module per ``shardflow`` subcommand.

Each module has ``add_parser(subparsers)``, which adds its parser and sets ``handler`` (a function
``args -> exit code``) with ``set_defaults``. Heavy imports (torch, prefect, ray, mlflow) go inside
the handlers, so that ``shardflow --help`` and the spec commands start fast.
"""
