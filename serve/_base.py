"""Re-export of :class:`kernels.StrictModel` (the one definition) for modules not yet switched."""

from kernels._base import StrictModel

__all__ = ["StrictModel"]
