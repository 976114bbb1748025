"""Fixed value sets of the config schemas, as Enums (Hydra lists the valid values when one is misspelt), and the
function that raises a ConfigError beside a field."""

from __future__ import annotations

from enum import Enum

from speedrun.errors import ConfigError


class Choice(str, Enum):
    """A fixed set of string values. Members compare equal to their strings and print as them."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


# One class per set, each member named as its value (OmegaConf matches a YAML string to a member by name).
# Written as classes rather than Enum("Name", "a b c") calls so that a type checker sees the members.


class HardwareName(Choice):
    auto = "auto"
    cpu = "cpu"
    t4 = "t4"
    a100 = "a100"
    h100 = "h100"
    b200 = "b200"


class SdpaKernel(Choice):
    auto = "auto"
    flash = "flash"
    cudnn = "cudnn"
    efficient = "efficient"
    math = "math"


class PrecisionName(Choice):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class ScheduleName(Choice):
    constant = "constant"
    progressive = "progressive"


class Progress(Choice):
    time = "time"
    step = "step"


class EvalName(Choice):
    standard = "standard"
    sliding = "sliding"


class TTTName(Choice):
    off = "off"
    lora = "lora"
    record = "record"


class TTTOptimizer(Choice):
    adam = "adam"
    sgd = "sgd"


class QuantName(Choice):
    off = "off"
    int8 = "int8"
    int6 = "int6"


class Compressor(Choice):
    zlib = "zlib"
    lzma = "lzma"
    brotli = "brotli"
    zstd = "zstd"
    pergroup = "pergroup"


class PergroupCodec(Choice):
    brotli = "brotli"
    lzma = "lzma"


class QuantClip(Choice):
    absmax_search = "absmax_search"
    sigma = "sigma"


class LoggerName(Choice):
    console = "console"
    wandb = "wandb"


class WandbMode(Choice):
    auto = "auto"
    online = "online"
    offline = "offline"


class NSCoefficients(Choice):
    quintic = "quintic"
    polar_express = "polar_express"


class MlpAct(Choice):
    relu2 = "relu2"
    leaky_relu2 = "leaky_relu2"


class ParallelLane(Choice):
    mean = "mean"
    attn = "attn"
    mlp = "mlp"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
