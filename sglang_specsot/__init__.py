"""sglang-specsot: Skeleton-of-Thought and speculative decoding as an SGLang plugin.

Importing this package imports neither SGLang nor torch; `plugin.register` does that.
"""

__version__ = "0.1.0"

# The SGLang release every host change and private-helper use in this package was written against.
SGLANG_VERSION = "0.5.23"
