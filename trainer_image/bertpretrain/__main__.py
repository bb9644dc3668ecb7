import sys

from bertpretrain.run import main

sys.exit(main(sys.argv[1:]))
