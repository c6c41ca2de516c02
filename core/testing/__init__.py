"""lpq's test kit for plugin authors.

* ``lpq_plugin`` fixture (via the ``lpq`` pytest plugin, active once lpq-core is
  installed): ``lpq_plugin(obj)`` registers a plugin object with a fresh plugin manager
  for one test and restores the previous manager afterwards.
* :class:`AdaptorConformance`: the contract every adaptor honours. Subclass it in one line
  and provide three fixtures in your ``conftest.py`` (see ``docs/writing-a-plugin.md``).
"""

from .conformance import AdaptorConformance

__all__ = ["AdaptorConformance"]
