"""``python -m sim.formal``: run the formal proofs (see :mod:`sim.formal`)."""

import sys

from sim.formal import main

sys.exit(main())
