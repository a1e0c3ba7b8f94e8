"""What one server serves and its limits (``specdraft serve`` builds it from its options)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import SpecConfig


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the id clients pass as "model"
    spec: SpecConfig = field(default_factory=SpecConfig)  # the default speculation; a request may pick its method / k
    max_waiting: int = 16  # queue bound: the next request gets 429
    request_timeout: float = 300.0  # seconds from arrival; a running generation stops there
    max_body_bytes: int = 1 << 20
