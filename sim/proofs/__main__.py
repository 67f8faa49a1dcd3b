"""``python -m sim.proofs``: run the formal proofs (see :mod:`sim.proofs`)."""

import sys

from . import main

sys.exit(main())
