"""User-facing errors.

Anything the user can cause (a bad path, a corrupt file, a hash mismatch, a mismatched
tokenizer, a bad parameter) raises :class:`SpecdraftError` with one line that names the
problem and the fix. The CLI prints that line and exits non-zero, without a traceback.
"""


class SpecdraftError(Exception):
    """An error caused by the user's input; its message is one line with the fix."""

    exit_code = 2


class ModelFileError(SpecdraftError):
    """A model file or directory is missing, corrupt, or fails its hash check."""


class TokenizerMismatchError(SpecdraftError):
    """Target and draft (or a retrieval index) do not share a vocabulary, so their tokens mean
    nothing to the target."""


class IndexFileError(SpecdraftError):
    """A retrieval index (``specdraft index build``) is missing or corrupt."""


class ParameterError(SpecdraftError):
    """An invalid sampling or speculation parameter."""


class ContextLengthError(SpecdraftError):
    """The prompt (plus the requested new tokens) does not fit the model's context."""
