"""lpq-torch: the lpq adaptor for PyTorch ``nn.Module`` models.

Importing this package does not import torch; the adaptor's modules import it when a hook
is first called for the ``torch`` framework.
"""

__version__ = "0.2.0"
