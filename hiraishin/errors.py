"""The library's own exception types. Every error names the bad input."""


class HiraishinError(Exception):
    """Base class for errors raised by hiraishin."""


class GGUFError(HiraishinError, ValueError):
    """A GGUF file cannot be used: not a GGUF, truncated, wrong architecture,
    unsupported tensor type, missing tensor, wrong shape, inconsistent metadata.
    The message names the file and the key or tensor."""


class QuantError(HiraishinError, ValueError):
    """A block-format operation got data it cannot handle (bad shape, size, type)."""


class PlanError(HiraishinError, ValueError):
    """A reduction plan or order was asked for a geometry it cannot express."""


class BackendError(HiraishinError, RuntimeError):
    """A backend (``cuda`` or ``cpu``) is unavailable or was misused."""


class TemplateError(HiraishinError, ValueError):
    """A chat template cannot be used: a syntax error, an undefined name, or the template's own
    ``raise_exception``. The message names the file and the problem."""


class PromptError(HiraishinError, ValueError):
    """Text given to the tokenizer is not text: not a ``str`` (e.g. ``bytes``), or a string that
    cannot be UTF-8 (lone surrogates, as Python makes of non-UTF-8 command-line bytes)."""


class DeviceMemoryError(HiraishinError, MemoryError):
    """Loading a model (weights, KV cache) needs more memory than the device has free. The message
    says how much was needed, how much is free and what would fit; what was allocated is released."""
