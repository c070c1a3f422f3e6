"""Stand-in for ``sgl_kernel`` (SGLang's CUDA kernels): import-only, see ``kimi_standin``."""

import kimi_standin

kimi_standin.install(__name__, version="0.0.0+kimi.standin")
