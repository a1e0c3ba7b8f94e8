"""specdraft: lossless speculative decoding for causal language models, CPU first."""
from .config import GenerationConfig, OutputFormat, SamplingConfig, SpecConfig
from .errors import SpecdraftError
from .pipeline import GenerationResult, Speculator, generate, load_model, stream

__version__ = "0.1.0"
__all__ = ["GenerationConfig", "GenerationResult", "OutputFormat", "SamplingConfig", "SpecConfig", "SpecdraftError", "Speculator",
           "generate", "load_model", "stream"]
