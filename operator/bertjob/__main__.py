"""``python -m bertjob``: the ``bertjob`` CLI (:mod:`bertjob.cli`)."""

import sys

from bertjob.cli import main

sys.exit(main(sys.argv[1:]))
