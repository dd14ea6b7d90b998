"""Flex-template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE): run one round of the Beam pipeline.

The launcher calls `python main.py --config=... --round=... [--checkpoint=...] --runner=DataflowRunner
--project=... --region=... ...`; everything that is not ours passes through to Beam (pipeline.run.main).
"""

from __future__ import annotations

import logging
import sys

from pipeline.run import main

if __name__ == "__main__":
    logging.getLogger().setLevel(logging.INFO)
    main(sys.argv[1:])
