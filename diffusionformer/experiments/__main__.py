import sys

from diffusionformer.experiments.cli import main

sys.exit(main())
