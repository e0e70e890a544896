"""flashrt_core: real-time pi0 / pi0.5 / pi0-FAST inference (reference model, checkpoint loading, public API), and
GR00T N1.6 on the reference path (flashrt_core.model.groot, groot_policy).

Never imports rclpy or any ROS module.
"""

from flashrt_core.config import ModelConfig, get_config
from flashrt_core.errors import (ActionDecodeError, CheckpointError, FlashRTError, Fp8GateError, Fp8NotCalibrated,
                                 InputError)


def __getattr__(name: str):
    # The API pulls in torch, the model and the I/O layer; import it on first use only.
    if name in ("load_model", "Policy"):
        from flashrt_core import api

        return getattr(api, name)
    if name == "RtcRequest":
        from flashrt_core.rtc_request import RtcRequest

        return RtcRequest
    raise AttributeError(f"module 'flashrt_core' has no attribute {name!r}")


__all__ = ["ActionDecodeError", "CheckpointError", "FlashRTError", "Fp8GateError", "Fp8NotCalibrated", "InputError",
           "ModelConfig", "Policy", "RtcRequest", "get_config", "load_model"]
