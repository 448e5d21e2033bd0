"""``accelerate.utils.dataclasses``'s names, for code ported with only its imports changed.

``from accelerate.utils.dataclasses import GradientAccumulationPlugin`` becomes
``from notebook_accel.utils.dataclasses import GradientAccumulationPlugin``. Every name
accelerate also has in ``accelerate.utils`` resolves as in :mod:`notebook_accel.utils`
(provided, or a placeholder that says why not); this module's own refusals are in
``refusals.py``. (The package imports the standard library's ``dataclasses`` with absolute
imports, never this module.)
"""

from __future__ import annotations

from typing import Any

from notebook_accel.refusals import REFUSED, UTILS, shim_attribute

_FROM_UTILS = (
    "AORecipeKwargs AutocastKwargs BnbQuantizationConfig ComputeEnvironment CustomDtype "
    "DDPCommunicationHookType DataLoaderConfiguration DeepSpeedPlugin "
    "DeepSpeedSequenceParallelConfig DistributedDataParallelKwargs DistributedType "
    "DynamoBackend FP8RecipeKwargs FullyShardedDataParallelPlugin GradScalerKwargs "
    "GradientAccumulationPlugin InitProcessGroupKwargs KwargsHandler LoggerType "
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION MSAMPRecipeKwargs MegatronLMPlugin PrecisionType "
    "ProfileKwargs ProjectConfiguration RNGType SageMakerDistributedType TERecipeKwargs "
    "TensorInformation TorchContextParallelConfig TorchDynamoPlugin TorchTensorParallelConfig "
    "TorchTensorParallelPlugin XPU_PROFILING_AVAILABLE_PYTORCH_VERSION "
    "add_model_config_to_megatron_parser compare_versions is_cuda_available is_hpu_available "
    "is_mlu_available is_msamp_available is_musa_available is_neuron_available "
    "is_npu_available is_rocm_available is_torch_version is_torchao_available "
    "is_transformer_engine_available is_xpu_available parse_flag_from_env str_to_bool"
).split()
# name -> module; __all__ is built from it
_EXPORTS = dict.fromkeys(_FROM_UTILS, UTILS)
__all__ = sorted([*_EXPORTS, *REFUSED[__name__]])


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return list(__all__)
