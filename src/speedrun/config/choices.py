"""Fixed value sets of the config schemas, as Enums (Hydra lists the valid values when one is misspelt), and the
helper that raises a ConfigError beside a field."""

from __future__ import annotations

from enum import Enum

from speedrun.errors import ConfigError


class Choice(str, Enum):
    """A fixed set of string values. Members compare equal to their strings and print as them."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def _choices(name: str, values: str) -> type[Choice]:
    """An Enum of Choice whose members are named as their values (OmegaConf matches by name)."""
    return Choice(name, {v: v for v in values.split()}, module=__name__)  # type: ignore[return-value]


HardwareName = _choices("HardwareName", "auto cpu t4 a100 h100 b200")
SdpaKernel = _choices("SdpaKernel", "auto flash cudnn efficient math")
PrecisionName = _choices("PrecisionName", "auto fp32 bf16 fp16 fp8")
ScheduleName = _choices("ScheduleName", "constant progressive")
Progress = _choices("Progress", "time step")
EvalName = _choices("EvalName", "standard sliding")
TTTName = _choices("TTTName", "off lora")
QuantName = _choices("QuantName", "off int8 int6")
Compressor = _choices("Compressor", "zlib lzma brotli zstd")
LoggerName = _choices("LoggerName", "console wandb")
WandbMode = _choices("WandbMode", "auto online offline")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
