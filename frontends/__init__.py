"""The torch layer: capture, measurement, the runtimes and torch.compile. Importing it on a torch
release the package was not tested on prints one line saying so (`frontends.torch_compat`)."""

from frontends.torch_compat import warn_if_untested_torch

warn_if_untested_torch()
