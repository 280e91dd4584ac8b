import sys

from diffusionformer.experiments.cli import main

if __name__ == "__main__":  # an import of this module (a tool importing every module) does not run the command line
    sys.exit(main())
