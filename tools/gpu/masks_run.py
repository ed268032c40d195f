"""The masks' GPU checks and race standalone (lab.masks.gpu): LAB_SESSION_DIR=$OUT/<session> python
tools/gpu/masks_run.py [checks-v09] [checks-v08] [race]; with no argument, all three."""
import sys

from lab.masks import gpu

sys.exit(gpu.main(sys.argv[1:]))
