"""accelerate's names that notebook_accel does not provide, each with its reason.

    a shim's __getattr__(name)            (paths.shim: utils, state, tracking, ...; and the
                                          package's own)
      -> its own names (provided, loaded from their part on first use)
      -> else refused(namespace, name): REFUSED[module][name] -> a placeholder class
         (importable, ``hasattr`` true, ``isinstance`` false) whose call raises
         NotProvidedError(reason, what to use instead)
      -> else AttributeError

No name is silently missing: tests/test_surface.py lists accelerate 1.16's public names in
each module of ``paths.SHIMS`` and checks each resolves here, provided or refused. Adding a
module (``notebook_accel.hooks``) is one more key here and in ``paths.SHIMS`` and
``paths.PROVIDED`` (paths.py holds the shims' machinery). README's "Migrating
from accelerate" section is rendered from this table (``surface.render_migration``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import NotProvidedError

__all__ = [
    "ATTRIBUTES",
    "PARAMETERS",
    "REFUSED",
    "Reason",
    "Refused",
    "RefusedParameter",
    "reason_for",
    "refuse",
    "refuse_given",
    "refused",
]


@dataclass(frozen=True)
class Reason:
    """Why a group of accelerate's names is not provided, and what to use instead.

    ``missing`` names the software whose absence is the reason (Megatron-LM, MS-AMP...);
    empty where the reason is a choice (accelerate's internals). A refused parameter or
    Accelerator attribute always names one (tests/test_surface.py).
    """

    why: str
    instead: str
    missing: str = ""


@dataclass(frozen=True)
class RefusedParameter:
    """A parameter ours takes for accelerate's signature and refuses when given anything but
    ``default`` (:func:`refuse_given`)."""

    reason: Reason
    default: Any = None


MEGATRON = Reason(
    "Megatron-LM is not supported",
    "FSDP (FullyShardedDataParallelPlugin), DeepSpeed (DeepSpeedPlugin) or "
    "ParallelismConfig(tp_size=...)",
    missing="Megatron-LM (megatron-core)",
)
SAGEMAKER = Reason(
    "Amazon SageMaker launches are not supported",
    "notebook_launcher or `notebook-accel launch` on the machine that runs the job",
    missing="Amazon SageMaker's distributed runtime",
)
TRANSFORMER_ENGINE = Reason(
    "NVIDIA Transformer Engine fp8 is not supported",
    "mixed_precision='fp8' (torchao float8, AORecipeKwargs)",
    missing="NVIDIA Transformer Engine",
)
ELASTIC = Reason(
    "an option of torch elastic's agent (notebook_launcher's workers meet at machine 0's "
    "address through its own table)",
    "the defaults (rdzv_backend='static'); rdzv_conf={'timeout': seconds} for the wait for "
    "machine 0; `torchrun` for an elastic job",
    missing="torch.distributed.elastic's agent (torchrun's), which notebook_launcher does not run",
)
FP8_INTERNALS = Reason(
    "accelerate's fp8 conversion internals",
    "mixed_precision='fp8': Accelerator.prepare converts the model",
)
NVME_OFFLOAD = Reason(
    "offloading to NVMe needs DeepSpeed's async_io op, which this DeepSpeed has not built",
    "offload_*_device='cpu', or DeepSpeed built with libaio (DS_BUILD_AIO=1)",
    missing="DeepSpeed's async_io op (libaio)",
)
BITSANDBYTES = Reason(
    "accelerate's bitsandbytes quantization is not supported",
    "transformers' from_pretrained(quantization_config=BitsAndBytesConfig(...))",
    missing="bitsandbytes",
)
DEVICES = Reason(
    "this device family is not supported (Gaudi HPU, Cambricon MLU, Moore Threads MUSA, "
    "Tecorigin SDAA, AWS Neuron, Intel XCCL, ROCm probes)",
    "CUDA, MPS, XPU, NPU, TPU or the CPU (notebook_accel.utils.is_cuda_available, ...)",
    missing="those devices' torch extensions (habana_frameworks, torch_mlu, torch_musa, "
    "torch_sdaa, torch_neuronx)",
)
LAUNCHER = Reason(
    "accelerate's launcher and CLI plumbing (launch commands, process placement)",
    "notebook_launcher / `notebook-accel launch`; patch_environment for variables",
)
DEEPSPEED_INTERNALS = Reason(
    "accelerate's DeepSpeed internals",
    "DeepSpeedPlugin with Accelerator.prepare; deepspeed's own deepspeed.zero API",
)
FSDP_INTERNALS = Reason(
    "accelerate's FSDP internals",
    "FullyShardedDataParallelPlugin (or fsdp=) with Accelerator.prepare, save_state/load_state",
)
CONTEXT_PARALLEL = Reason(
    "accelerate's torch tensor/context-parallel configs are not supported",
    "ParallelismConfig(tp_size=..., dp_shard_size=...) for tensor parallelism",
)
OPERATIONS = Reason(
    "accelerate's nested-structure helpers",
    "torch.utils._pytree.tree_map, or gather/reduce/broadcast/send_to_device, "
    "which take nested structures",
)
BIG_MODEL_HELPERS = Reason(
    "accelerate's big-model internals (device maps, offload files, tied weights)",
    "init_empty_weights, infer_auto_device_map, load_checkpoint_and_dispatch",
)
LAYERWISE_CASTING = Reason(
    "accelerate's layerwise casting (weights stored in a lower dtype, upcast per layer)",
    "mixed_precision='bf16' or 'fp16', or load the model in the dtype you want",
)
HOOK_ATTACHING = Reason(
    "accelerate's lower-level hook attachment",
    "dispatch_model, cpu_offload or disk_offload, which attach the hooks, or add_hook_to_module",
)
VERSIONS = Reason(
    "accelerate's version helpers", "packaging.version and importlib.metadata.version"
)
SHARED_STATE = Reason(
    "accelerate's process-wide shared dicts (Borg state); notebook_accel keeps none",
    "AcceleratorState(), PartialState() or GradientState()",
)
TRACKERS = Reason(
    "this tracker is not built in",
    "log_with='tensorboard', 'wandb', 'mlflow' or 'trackio', or a GeneralTracker subclass "
    "in log_with=[...]",
    missing="an integration with Aim, ClearML, Comet, DVCLive or SwanLab",
)
TRACKING_INTERNALS = Reason(
    "accelerate's tracker registry internals", "log_with=[...] with names or GeneralTracker objects"
)
INTERNALS = Reason(
    "an accelerate internal that no public notebook_accel call needs",
    "the Accelerator method of the same job (accelerator.save, accelerator.autocast, "
    "accelerator.device, ...)",
)


def _group(reason: Reason, names: str) -> dict[str, Reason]:
    return dict.fromkeys(names.split(), reason)


def _table(*groups: dict[str, Reason]) -> dict[str, Reason]:
    out: dict[str, Reason] = {}
    for group in groups:
        out.update(group)
    return out


_UTILS_MEGATRON = _group(
    MEGATRON,
    "AbstractTrainStep BertTrainStep GPTTrainStep T5TrainStep MegatronLMDummyDataLoader "
    "MegatronLMDummyScheduler MegatronLMPlugin add_model_config_to_megatron_parser "
    "avg_losses_across_data_parallel_group is_megatron_lm_available",
)
_UTILS_DEVICES = _group(
    DEVICES,
    "is_hpu_available is_mlu_available is_musa_available is_sdaa_available "
    "is_neuron_available is_habana_gaudi1 is_xccl_available is_amdsmi_available "
    "is_rocm_available",
)

# module -> name -> reason. A module's names not listed here are provided by its shim.
REFUSED: dict[str, dict[str, Reason]] = {
    "notebook_accel": {},
    "notebook_accel.utils": _table(
        _UTILS_MEGATRON,
        _UTILS_DEVICES,
        _group(SAGEMAKER, "SageMakerDistributedType prepare_sagemager_args_inputs"),
        _group(SAGEMAKER, "is_sagemaker_available"),
        _group(
            TRANSFORMER_ENGINE,
            "TERecipeKwargs apply_fp8_autowrap contextual_fp8_autocast "
            "convert_model has_transformer_engine_layers is_transformer_engine_available "
            "is_transformer_engine_mxfp8_available",
        ),
        _group(
            FP8_INTERNALS,
            "convert_model_to_fp8_ao has_ao_layers filter_first_and_last_linear_layers "
            "check_cuda_fp8_capability torchao_required",
        ),
        _group(
            BITSANDBYTES,
            "BnbQuantizationConfig load_and_quantize_model has_4bit_bnb_layers "
            "is_4bit_bnb_available is_8bit_bnb_available is_bnb_available "
            "is_bitsandbytes_multi_backend_available",
        ),
        _group(
            LAUNCHER,
            "PrepareForLaunch TORCH_LAUNCH_PARAMS prepare_deepspeed_cmd_env "
            "prepare_multi_gpu_env prepare_simple_launcher_cmd_env prepare_tpu install_xla "
            "get_cpu_distributed_information set_numa_affinity is_port_in_use check_os_kernel "
            "check_cuda_p2p_ib_support ComputeEnvironment convert_dict_to_env_variables "
            "clear_environment purge_accelerate_environment "
            "are_libraries_initialized "
            "get_gpu_info is_import_timer_available",
        ),
        _group(
            DEEPSPEED_INTERNALS,
            "DeepSpeedEngineWrapper DeepSpeedOptimizerWrapper DeepSpeedSchedulerWrapper "
            "HfDeepSpeedConfig GatheredParameters get_active_deepspeed_plugin "
            "map_pytorch_optim_to_deepspeed deepspeed_required compile_regions_deepspeed "
            "DeepSpeedSequenceParallelConfig",
        ),
        _group(
            FSDP_INTERNALS,
            "fsdp2_apply_ac fsdp2_canonicalize_names fsdp2_load_full_state_dict "
            "fsdp2_prepare_model fsdp2_switch_optimizer_parameters get_fsdp2_grad_scaler "
            "load_fsdp_model load_fsdp_optimizer save_fsdp_model save_fsdp_optimizer "
            "enable_fsdp_ram_efficient_loading disable_fsdp_ram_efficient_loading "
            "compile_regions_fsdp2 model_has_dtensor",
        ),
        _group(CONTEXT_PARALLEL, "TorchContextParallelConfig get_model_tp_size"),
        _group(
            OPERATIONS,
            "CannotPadNestedTensorWarning TensorInformation concatenate convert_outputs_to_fp32 "
            "convert_to_fp32 copy_tensor_to_devices find_batch_size find_device "
            "get_data_structure honor_type ignorant_find_batch_size initialize_tensors "
            "is_namedtuple is_tensor_information is_torch_tensor listify pad_input_tensors "
            "recursively_apply slice_tensors TORCH_DISTRIBUTED_OPERATION_TYPES get_pretty_name "
            "merge_dicts recursive_getattr",
        ),
        _group(
            BIG_MODEL_HELPERS,
            "OffloadedWeightsLoader PrefixedDataset align_module_device "
            "calculate_maximum_sizes check_tied_parameters_in_config "
            "check_tied_parameters_on_same_device clean_state_dict_for_safetensors "
            "convert_bytes ensure_weights_retied get_module_children_bottom_up "
            "has_offloaded_params id_tensor_storage load_offloaded_weight "
            "load_offloaded_weights load_state_dict offload_weight save_offload_index "
            "CustomDtype",
        ),
        _group(
            VERSIONS,
            "compare_versions is_torch_version",
        ),
        _group(
            INTERNALS,
            "save load get_grad_scaler get_mixed_precision_context_manager "
            "get_current_device_type has_compiled_regions is_peft_model "
            "is_torchdata_stateful_dataloader_available",
        ),
    ),
    "notebook_accel.state": _table(
        _group(SHARED_STATE, "SharedDict ThreadLocalSharedDict"),
        _group(INTERNALS, "do_nothing"),
    ),
    "notebook_accel.big_modeling": _table(
        _group(
            LAYERWISE_CASTING,
            "LayerwiseCastingHook SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING "
            "attach_layerwise_casting_hooks",
        ),
        _group(HOOK_ATTACHING, "attach_align_device_hook attach_align_device_hook_on_blocks"),
    ),
    "notebook_accel.hooks": _table(
        _group(LAYERWISE_CASTING, "LayerwiseCastingHook"),
        _group(
            HOOK_ATTACHING,
            "attach_align_device_hook attach_align_device_hook_on_blocks "
            "attach_execution_device_hook",
        ),
        _group(INTERNALS, "get_non_persistent_buffers"),
    ),
    "notebook_accel.tracking": _table(
        _group(TRACKERS, "AimTracker ClearMLTracker CometMLTracker DVCLiveTracker SwanLabTracker"),
        _group(
            TRACKING_INTERNALS,
            "LOGGER_TYPE_TO_CLASS filter_trackers get_available_trackers on_main_process "
            "register_tracker_class logger",
        ),
    ),
    "notebook_accel.utils.dataclasses": _table(
        _group(
            MEGATRON,
            "MODEL_CONFIGS_TO_MEGATRON_PARSERS parse_bert_config parse_glm4_moe_config "
            "parse_gpt2_config parse_llama_config parse_t5_config",
        ),
        _group(
            FSDP_INTERNALS,
            "FSDP_AUTO_WRAP_POLICY FSDP_BACKWARD_PREFETCH FSDP_SHARDING_STRATEGY "
            "get_module_class_from_name",
        ),
        _group(CONTEXT_PARALLEL, "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION"),
        _group(INTERNALS, "BaseEnum EnumWithContains"),
    ),
    "notebook_accel.utils.memory": {},
    "notebook_accel.logging": {},
    "notebook_accel.local_sgd": {},
}


# our callable's __qualname__ -> its parameter -> why a value is refused (the parameter is in
# its signature, at its default: a call that leaves it there runs)
PARAMETERS: dict[str, dict[str, RefusedParameter]] = {
    "Accelerator": {"megatron_lm_plugin": RefusedParameter(MEGATRON)},
    "notebook_launcher": {
        "rdzv_backend": RefusedParameter(ELASTIC, "static"),
        "rdzv_id": RefusedParameter(ELASTIC, "none"),
        "monitor_interval": RefusedParameter(ELASTIC, 0.1),
        "log_line_prefix_template": RefusedParameter(ELASTIC),
    },
    "load_checkpoint_in_model": {"offload_8bit_bnb": RefusedParameter(BITSANDBYTES, False)},
    "set_module_tensor_to_device": {"fp16_statistics": RefusedParameter(BITSANDBYTES)},
}

# accelerate's Accelerator attributes ours has as placeholders: a method that raises
ATTRIBUTES: dict[str, Reason] = {}


class Refused:
    """Base of the placeholders: importable, ``isinstance`` false, using it raises."""

    _where: ClassVar[str] = ""
    _reason: ClassVar[Reason] = INTERNALS

    def __new__(cls, *args: Any, **kwargs: Any) -> Refused:
        raise NotProvidedError(cls._where, cls._reason.why, cls._reason.instead)


def refuse_given(where: str, **given: Any) -> None:
    """Raise NotProvidedError for the first of ``where``'s refused parameters
    (``PARAMETERS[where]``) given a value other than its default; the others pass.

    Example:
        >>> refuse_given("Accelerator", megatron_lm_plugin=None)  # its default: fine
    """
    table = PARAMETERS[where]
    for name, value in given.items():
        entry = table[name]
        default = entry.default
        if value is default or (type(value) is type(default) and value == default):
            continue
        reason = entry.reason
        raise NotProvidedError(f"{where}({name}={value!r})", reason.why, reason.instead)


def refuse(where: str, reason: Reason) -> NotProvidedError:
    """The error for a use of ``where`` that ``reason`` refuses (to raise)."""
    return NotProvidedError(where, reason.why, reason.instead)


def reason_for(module: str, name: str) -> Reason | None:
    """The reason ``module``'s ``name`` is refused, or None if it is not."""
    return REFUSED.get(module, {}).get(name)


def refused(namespace: dict[str, Any], name: str) -> type[Refused]:
    """The placeholder for a refused name of the module whose globals are ``namespace``
    (kept there from then on); AttributeError for a name that is not refused."""
    module = namespace["__name__"]
    reason = reason_for(module, name)
    if reason is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    where = f"{module}.{name}"
    doc = f"Not provided: {reason.why}. Use {reason.instead}."
    placeholder = type(
        name, (Refused,), {"__module__": module, "__doc__": doc, "_where": where, "_reason": reason}
    )
    namespace[name] = placeholder
    return placeholder
