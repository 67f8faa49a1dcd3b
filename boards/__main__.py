"""``python -m boards build --target array|block|core|board --board icebreaker|ulx3s``."""

import sys

from boards.cli import main

sys.exit(main())
