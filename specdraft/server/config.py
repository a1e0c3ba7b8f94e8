"""What one server serves and its limits (``specdraft serve`` builds it from its options)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..batch import PREFILL_CHUNK
from ..config import SpecConfig


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the id clients pass as "model"
    spec: SpecConfig = field(default_factory=SpecConfig)  # the default speculation; a request may pick its method / k
    max_waiting: int = 16  # queue bound: the next request gets 429
    request_timeout: float = 300.0  # seconds from arrival; a running generation stops there
    max_body_bytes: int = 1 << 20
    # cache slots of the requests decoded together (fp32 K and V: ~57 kB a slot for the default
    # 1.5B target, so ~470 MB); a request joins them while its prompt, max_tokens and widest
    # check fit in what the others leave. 0: every request and choice runs alone, in turn
    batch_slots: int = 8192
    # prompt rows a step of a request joining others being decoded, packed into their checks
    # (batch.PREFILL_CHUNK; 0: its whole prompt in one step)
    prefill_chunk: int = PREFILL_CHUNK
    # the key a client must send (``Authorization: Bearer KEY``) to reach /v1/ (401 without it);
    # None: open to whoever reaches the port
    api_key: str | None = None
