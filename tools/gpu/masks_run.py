"""The masks' GPU checks and race standalone (lab.masks.gpu): LAB_SESSION_DIR=$OUT/<session> python
tools/gpu/masks_run.py [checks-v09] [checks-v08] [race] [checks-bwd] [race-bwd]; with no argument, all five."""
import sys

from lab.masks import gpu

sys.exit(gpu.main(sys.argv[1:]))
