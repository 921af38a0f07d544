"""``python -m conformance.generate``: see :mod:`conformance.generate`."""

import sys

from conformance.generate import main

sys.exit(main())
