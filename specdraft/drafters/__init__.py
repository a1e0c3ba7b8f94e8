"""Drafters ("prophets"): importing this package registers every built-in drafter."""
from . import (  # noqa: F401  (registration side effects)
                   draft_model,
                   eagle,
                   feature_head,
                   fusion,
                   hybrid,
                   lookahead,
                   medusa,
                   mtp,
                   prompt_lookup,
                   recycle,
                   retrieval,
                   self_draft,
                   suffix,
)
from .base import (
                   Draft,
                   Drafter,
                   DrafterContext,
                   build_drafter,
                   drafter_names,
                   head_kind,
                   needs_draft_model,
                   needs_head,
                   register,
)

__all__ = ["Draft", "Drafter", "DrafterContext", "build_drafter", "drafter_names", "head_kind", "needs_draft_model", "needs_head",
           "register"]
