"""Stand-in for ``torchvision`` (PyPI's build needs CUDA libraries): see ``kimi_standin``."""

import kimi_standin

kimi_standin.install(__name__, version="0.0.0+kimi.standin")
