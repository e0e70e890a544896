"""Exceptions raised by the inference core.

``InputError`` is a ``ValueError``: bad observations, prompts or states handed to ``predict``.
``CheckpointError`` covers missing, malformed or inconsistent checkpoint files (weights, norm stats,
tokenizer). Messages always name the offending input, file or key.
"""


class InputError(ValueError):
    """An input to the policy (image, prompt, state, noise) is invalid; the message says which and why."""


class CheckpointError(Exception):
    """A checkpoint file is missing, malformed or does not match the model; the message names file and key."""
