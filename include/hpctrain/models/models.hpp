#pragma once
// The language-model layer: GPT-2 and Llama modules, Hugging Face checkpoints both ways, generation.
// LibTorch only; usable without hpctrain's Trainer (models/ includes nothing from train/).
#include <hpctrain/models/activation_checkpoint.hpp>
#include <hpctrain/models/causal_lm.hpp>
#include <hpctrain/models/deferred_initialization.hpp>
#include <hpctrain/models/export_format.hpp>
#include <hpctrain/models/fill_mask.hpp>
#include <hpctrain/models/generation.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/models/gpt2_config.hpp>
#include <hpctrain/models/hf_checkpoint.hpp>
#include <hpctrain/models/hf_export.hpp>
#include <hpctrain/models/hf_layout.hpp>
#include <hpctrain/models/initialization.hpp>
#include <hpctrain/models/llama.hpp>
#include <hpctrain/models/llama_config.hpp>
#include <hpctrain/models/lora.hpp>
#include <hpctrain/models/model_units.hpp>
#include <hpctrain/models/pretrained_config.hpp>
#include <hpctrain/models/roberta.hpp>
#include <hpctrain/models/roberta_config.hpp>
#include <hpctrain/models/safetensors.hpp>
#include <hpctrain/models/safetensors_format.hpp>
#include <hpctrain/models/safetensors_shards.hpp>
#include <hpctrain/models/scoped_switch.hpp>
