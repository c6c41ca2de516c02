"""lpq's test kit for plugin authors.

* ``lpq_plugin`` fixture (via the ``lpq`` pytest plugin, active once lpq-core is
  installed): ``lpq_plugin(obj)`` registers a plugin object with a fresh plugin manager
  for one test and restores the previous manager afterwards.
* :class:`AdaptorConformance`: the contract every adaptor honours. Subclass it in one line
  and provide three fixtures in your ``conftest.py`` (see ``docs/writing-a-plugin.md``).
* :class:`ConformanceWarning`: what a check new in this minor version emits instead of
  failing (set ``LPQ_CONFORMANCE_STRICT=1`` to make it fail); :func:`introduced` marks
  such checks.
"""

from .conformance import AdaptorConformance
from .introduced import ConformanceFailure, ConformanceWarning, introduced

__all__ = ["AdaptorConformance", "ConformanceFailure", "ConformanceWarning", "introduced"]
