"""dgxdoctor: health agent for vLLM tensor-parallel serving across DGX nodes."""

__version__ = "0.2.0"
