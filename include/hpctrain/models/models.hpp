#pragma once
// The language-model layer: GPT-2 and Llama modules, Hugging Face checkpoints both ways, generation.
// LibTorch only; usable without hpctrain's Trainer (models/ includes nothing from train/).
#include <hpctrain/models/causal_lm.hpp>
#include <hpctrain/models/deferred_initialization.hpp>
#include <hpctrain/models/generation/fill_mask.hpp>
#include <hpctrain/models/generation/generation.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/models/gpt2_config.hpp>
#include <hpctrain/models/hf/export_format.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/hf/hf_export.hpp>
#include <hpctrain/models/hf/hf_layout.hpp>
#include <hpctrain/models/hf/pretrained_config.hpp>
#include <hpctrain/models/hf/safetensors.hpp>
#include <hpctrain/models/hf/safetensors_format.hpp>
#include <hpctrain/models/hf/safetensors_shards.hpp>
#include <hpctrain/models/initialization.hpp>
#include <hpctrain/models/kernels/scoped_switch.hpp>
#include <hpctrain/models/llama.hpp>
#include <hpctrain/models/llama_config.hpp>
#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/models/model_units.hpp>
#include <hpctrain/models/recompute/activation_checkpoint.hpp>
#include <hpctrain/models/roberta.hpp>
#include <hpctrain/models/roberta_config.hpp>
