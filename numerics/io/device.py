"""The one check of a ``--device`` option (reports.build, numerics.bench): a name torch knows and a
device this machine has, refused before any computation.  torch is imported only for a CUDA
name, so that ``--help`` and ``--device cpu`` stay fast."""
from __future__ import annotations


def check_device_option(device: str, flag: str = "--device") -> str:
    """``device`` if it is ``cpu``, or ``cuda`` / ``cuda:N`` with that CUDA device present;
    else ValueError saying which devices there are."""
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isascii() and device[5:].isdigit()):
        raise ValueError(f"{flag} must be cpu, cuda or cuda:N, got {device!r} (an unknown device)")
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"{flag} {device} requested but no CUDA device is available "
                         f"(torch {torch.__version__}); use {flag} cpu")
    count = torch.cuda.device_count()
    if ":" in device and int(device[5:]) >= count:
        raise ValueError(f"{flag} {device}: only {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return device
