"""`python -m ascend_runtime` is the same as the `ascend-deploy` console script."""

import sys

from ascend_runtime.cli import main

sys.exit(main())
