"""accelerate's module paths: one table of what each of ours provides, and their machinery.

    SHIMS      accelerate's module -> ours (accelerate.state -> notebook_accel.state, ...)
    PROVIDED   our module -> {accelerate's name: the module of ours that defines it}; a name
               accelerate re-exports from accelerate.utils maps to UTILS and resolves as
               notebook_accel.utils does (provided or refused)
    shim(__name__) -> __all__, __getattr__, __dir__ for one of those modules, which is then
               its docstring and one line:
                 __all__, __getattr__, __dir__ = shim(__name__)
               a name loads from its module on first use (no torch at import); a name
               accelerate has there that we do not provide is refused (refusals.py: a
               placeholder that says why); __all__ is what we provide, dir() adds the
               refused names
    the package itself (notebook_accel) keeps its own names in __init__.py, and utils adds
    them to its table (accelerate.utils has accelerate's top-level names too)

Adding an accelerate module is one entry in each table (and in refusals.REFUSED).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from . import _lazy_attribute, refusals

__all__ = ["PROVIDED", "SHIMS", "UTILS", "shim"]

# accelerate's module -> the module of ours that stands for it
SHIMS = {
    "accelerate": "notebook_accel",
    "accelerate.utils": "notebook_accel.utils",
    "accelerate.utils.memory": "notebook_accel.utils.memory",
    "accelerate.utils.dataclasses": "notebook_accel.utils.dataclasses",
    "accelerate.state": "notebook_accel.state",
    "accelerate.tracking": "notebook_accel.tracking",
    "accelerate.logging": "notebook_accel.logging",
    "accelerate.local_sgd": "notebook_accel.local_sgd",
    "accelerate.big_modeling": "notebook_accel.big_modeling",
    "accelerate.hooks": "notebook_accel.hooks",
}

UTILS = "notebook_accel.utils"  # where a shim's re-exports of accelerate.utils names resolve

_T = "notebook_accel.training."
_B = "notebook_accel.big_model."
_PROBES = "notebook_accel.hardware.available"


def _each(module: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), module)


PROVIDED: dict[str, dict[str, str]] = {
    # Names accelerate keeps in accelerate.utils only (not at its top level); the package's
    # own names are there too (shim's ``fallback``).
    "notebook_accel.utils": {
        **_each(_T + "strategies.dummies", "DummyOptim DummyScheduler"),
        **_each(
            _PROBES,
            "is_aim_available is_bf16_available is_boto3_available is_clearml_available "
            "is_comet_ml_available is_cuda_available is_datasets_available "
            "is_deepspeed_available is_dvclive_available is_fp16_available is_fp8_available "
            "is_lomo_available is_matplotlib_available is_mlflow_available is_mps_available "
            "is_npu_available is_pandas_available is_peft_available is_pynvml_available "
            "is_pytest_available is_schedulefree_available is_swanlab_available "
            "is_tensorboard_available is_timm_available is_torch_xla_available "
            "is_torchao_available is_torchdata_available is_torchvision_available "
            "is_trackio_available is_transformers_available is_triton_available "
            "is_wandb_available is_xpu_available",
        ),
        **_each(
            _T + "operations",
            "broadcast broadcast_object_list gather gather_object reduce pad_across_processes "
            "send_to_device wait_for_everyone extract_model_from_parallel",
        ),
        **_each(_T + "handlers", "GradientAccumulationPlugin"),
        **_each(
            "notebook_accel.options.parallelism",
            "TorchTensorParallelConfig TorchTensorParallelPlugin",
        ),
        **_each(
            "notebook_accel.devices",
            "get_accelerator_free_memory get_distributed_backend get_torch_accelerator_backend "
            "normalize_device",
        ),
        **_each(_T + "data.rng", "RNGType synchronize_rng_state"),
        **_each(_T + "trackers", "LoggerType"),
        **_each(_T + "profiling", "PROFILE_PATTERN_NAME"),
        **_each(_T + "checkpoint.sharded", "merge_fsdp_weights"),
        **_each(
            _T + "checkpoint.files",
            "MODEL_NAME OPTIMIZER_NAME RNG_STATE_NAME SAFE_MODEL_NAME SAFE_WEIGHTS_INDEX_NAME "
            "SAFE_WEIGHTS_NAME SAFE_WEIGHTS_PATTERN_NAME SAMPLER_NAME SCALER_NAME "
            "SCHEDULER_NAME WEIGHTS_INDEX_NAME WEIGHTS_NAME WEIGHTS_PATTERN_NAME",
        ),
        **_each("notebook_accel.config", "PrecisionType write_basic_config"),
        **_each(
            "notebook_accel.env",
            "patch_environment str_to_bool parse_flag_from_env parse_choice_from_env "
            "get_int_from_env",
        ),
        **_each(
            _B + "tensors",
            "compute_module_sizes convert_file_size_to_int dtype_byte_size "
            "find_tied_parameters named_module_tensors retie_parameters "
            "set_module_tensor_to_device",
        ),
        **_each(_B + "memory", "get_max_memory get_balanced_memory"),
        **_each(_B + "device_map", "infer_auto_device_map get_max_layer_size"),
        **_each(_B + "loading", "load_checkpoint_in_model"),
        **_each(_B + "dispatch", "check_device_map extract_submodules_state_dict"),
        **_each(_B + "offload", "offload_state_dict"),
    },
    "notebook_accel.utils.memory": {
        **_each(
            _T + "memory",
            "clear_device_cache find_executable_batch_size release_memory should_reduce_batch_size",
        ),
        **_each(UTILS, "get_torch_accelerator_backend"),
    },
    "notebook_accel.utils.dataclasses": {
        **_each(
            UTILS,
            "AORecipeKwargs AutocastKwargs BnbQuantizationConfig ComputeEnvironment CustomDtype "
            "DDPCommunicationHookType DataLoaderConfiguration DeepSpeedPlugin "
            "DeepSpeedSequenceParallelConfig DistributedDataParallelKwargs DistributedType "
            "DynamoBackend FullyShardedDataParallelPlugin GradScalerKwargs "
            "GradientAccumulationPlugin InitProcessGroupKwargs KwargsHandler LoggerType "
            "MegatronLMPlugin PrecisionType ProfileKwargs ProjectConfiguration RNGType "
            "SageMakerDistributedType TERecipeKwargs TensorInformation "
            "TorchContextParallelConfig TorchDynamoPlugin TorchTensorParallelConfig "
            "TorchTensorParallelPlugin add_model_config_to_megatron_parser compare_versions "
            "get_torch_accelerator_backend is_hpu_available is_rocm_available is_torch_version "
            "is_torchao_available is_transformer_engine_available parse_flag_from_env "
            "str_to_bool",
        ),
        **_each(_T + "precision.fp8", "FP8BackendType"),
    },
    "notebook_accel.state": {
        **_each(_T + "accelerator_state", "AcceleratorState is_initialized"),
        **_each(_T + "processes", "PartialState"),
        **_each(_T + "process", "GradientState"),
        **_each(
            UTILS,
            "DistributedType DynamoBackend GradientAccumulationPlugin SageMakerDistributedType "
            "check_cuda_fp8_capability check_cuda_p2p_ib_support deepspeed_required "
            "get_cpu_distributed_information get_distributed_backend get_int_from_env "
            "get_torch_accelerator_backend is_datasets_available is_deepspeed_available "
            "is_fp8_available is_habana_gaudi1 is_mlu_available is_musa_available "
            "is_npu_available is_sdaa_available is_torch_xla_available parse_choice_from_env "
            "parse_flag_from_env set_numa_affinity",
        ),
    },
    "notebook_accel.tracking": {
        **_each(
            _T + "trackers",
            "GeneralTracker MLflowTracker TensorBoardTracker TrackioTracker WandBTracker",
        ),
        **_each(_T + "processes", "PartialState"),
        **_each(_T + "logs", "get_logger"),
        **_each(
            UTILS,
            "LoggerType compare_versions is_aim_available is_clearml_available "
            "is_comet_ml_available is_dvclive_available is_mlflow_available "
            "is_swanlab_available is_tensorboard_available is_trackio_available "
            "is_wandb_available listify str_to_bool",
        ),
    },
    "notebook_accel.logging": {
        **_each(
            _T + "logs",
            "MultiProcessAdapter get_logger get_verbosity set_verbosity set_verbosity_debug "
            "set_verbosity_error set_verbosity_info set_verbosity_warning",
        ),
        **_each(_T + "processes", "PartialState"),  # accelerate's import, kept there
    },
    "notebook_accel.local_sgd": {
        **_each(_T + "averaging", "LocalSGD"),
        # accelerate's imports there, kept for code that takes them from this module
        **_each(_T + "accelerator", "Accelerator"),
        **_each(_T + "process", "DistributedType"),
    },
    "notebook_accel.big_modeling": {
        **_each(_B + "empty", "init_empty_weights init_on_device"),
        **_each(
            _B + "dispatch",
            "dispatch_model cpu_offload cpu_offload_with_hook disk_offload "
            "extract_submodules_state_dict check_device_map",
        ),
        **_each(_B + "loading", "load_checkpoint_and_dispatch load_checkpoint_in_model"),
        **_each(_B + "device_map", "infer_auto_device_map"),
        **_each(_B + "memory", "get_balanced_memory"),
        **_each(_B + "tensors", "find_tied_parameters retie_parameters"),
        **_each(_B + "offload", "offload_state_dict"),
        **_each(
            _B + "forward_hooks",
            "add_hook_to_module AlignDevicesHook CpuOffload UserCpuOffloadHook",
        ),
        **_each(
            UTILS,
            "OffloadedWeightsLoader check_cuda_p2p_ib_support get_torch_accelerator_backend "
            "is_bnb_available normalize_device parse_flag_from_env recursive_getattr",
        ),
    },
    "notebook_accel.hooks": {
        **_each(
            _B + "forward_hooks",
            "ModelHook SequentialHook AlignDevicesHook CpuOffload UserCpuOffloadHook "
            "add_hook_to_module remove_hook_from_module remove_hook_from_submodules",
        ),
        **_each(_B + "moves", "send_to_device find_device"),
        **_each(_B + "tensors", "named_module_tensors set_module_tensor_to_device"),
        **_each(_T + "processes", "PartialState"),
        **_each(UTILS, "PrefixedDataset normalize_device recursive_getattr"),
        **_each(_T + "memory", "clear_device_cache"),
    },
}

# accelerate's submodules that scripts import from (``from accelerate.utils.memory import``)
_SUBMODULES = {"notebook_accel.utils": ("memory", "dataclasses")}
# modules whose names also include the package's own public names (accelerate.utils has
# accelerate's top-level names)
_WITH_THE_PACKAGES = {"notebook_accel.utils"}


def shim(module: str) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` (PEP 562) and ``__dir__`` of our module ``module``."""
    exports = PROVIDED[module]
    names = sorted(exports)

    def attribute(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        namespace = vars(sys.modules[module])
        if name in exports:
            return _lazy_attribute(namespace, exports, name)
        if name in _SUBMODULES.get(module, ()):
            return importlib.import_module(f"{module}.{name}")
        if module in _WITH_THE_PACKAGES:
            try:
                return getattr(importlib.import_module("notebook_accel"), name)
            except AttributeError:
                pass
        return refusals.refused(namespace, name)

    def listing() -> list[str]:
        shown = {*names, *refusals.REFUSED.get(module, {})}
        if module in _WITH_THE_PACKAGES:
            shown |= set(importlib.import_module("notebook_accel").__all__)
        return sorted(shown)

    return names, attribute, listing
