"""The benchmark's own error: its input (prompts file, method list, output path) is unusable."""
from __future__ import annotations

from ..errors import SpecdraftError


class BenchError(SpecdraftError):
    """The benchmark's input (prompts file, method list, output path) is unusable."""
