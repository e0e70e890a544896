"""Exceptions raised by the inference core.

``InputError`` is a ``ValueError``: bad observations, prompts, states or noise handed to ``predict``.
``CheckpointError`` covers missing, malformed or inconsistent checkpoint files (weights, norm stats,
tokenizer). ``Fp8NotCalibrated``: an FP8 policy asked for actions before its calibration; ``Fp8GateError``: its
actions failed the accuracy gate after it. ``ActionDecodeError`` (a ``ValueError``): a pi0-FAST output that decodes
to no action chunk.
Messages always name the offending input, file or key.
"""


class FlashRTError(Exception):
    """Base class of every error raised on purpose by flashrt_core."""


class InputError(FlashRTError, ValueError):
    """An observation, prompt, state or noise array handed to a policy is unusable."""


class CheckpointError(FlashRTError, RuntimeError):
    """A checkpoint directory is missing files, or its tensors do not match the model's weight spec."""


class Fp8NotCalibrated(FlashRTError, RuntimeError):
    """An FP8 engine was asked for actions before its activation scales were set from real observations."""


class Fp8GateError(FlashRTError, RuntimeError):
    """The FP8 engine's actions on the held-out observations are below the accuracy gate after calibration."""


class ActionDecodeError(FlashRTError, ValueError):
    """A token sequence that does not decode to an action chunk (a pi0-FAST model emitted an invalid sequence)."""
