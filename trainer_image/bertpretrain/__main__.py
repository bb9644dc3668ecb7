"""``python -m bertpretrain``: the trainer's entry point (:mod:`bertpretrain.run`)."""

import sys

from bertpretrain.run import main

sys.exit(main(sys.argv[1:]))
