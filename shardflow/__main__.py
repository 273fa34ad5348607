"""``python -m shardflow``: the ``shardflow`` command."""

import sys

from shardflow import main

sys.exit(main())
