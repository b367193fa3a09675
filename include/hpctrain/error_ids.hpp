#pragma once
// Every error id hpctrain can raise, as a named constant used at the throw site:
//   throw RuntimeError(errors::runtime_sbatch, message);   throw SpecError(errors::spec_knob, subject, reason);
// Adding an id: one line here (in your area's block), one row in docs/errors.md. A test
// (tests/job/error_ids_test.cpp) reads this file, docs/errors.md and the headers, and fails naming every id
// that is in one but not the other, with the file and line that raises it. Spec errors raised through
// `detail::require(ok, "<field>", ...)` carry `hpctrain.spec.<field>`: those fields are listed here too. A
// family of ids made at run time (a config's field names) is documented as a pattern,
// `hpctrain.spec.gpt2.<field>`, and needs no constant.
#include <string_view>

namespace hpctrain {

/// A stable error id, `hpctrain.<family>.<what>`: made only from a literal, checked at compile time.
class ErrorId {
 public:
  explicit consteval ErrorId(const char* id) : id_(id) {
    if (!id_.starts_with("hpctrain.spec.") && !id_.starts_with("hpctrain.runtime.") && id_ != "hpctrain.usage")
      throw "an error id starts with hpctrain.spec., hpctrain.runtime. or is hpctrain.usage";  // not constant: fails to
                                                                                               // compile
  }
  constexpr std::string_view str() const { return id_; }
  constexpr bool operator==(const ErrorId&) const = default;

 private:
  std::string_view id_;
};

namespace errors {
// --- usage and knobs (job/cli.hpp, job/knobs.hpp) ---
inline constexpr ErrorId usage{"hpctrain.usage"};
inline constexpr ErrorId spec_knob{"hpctrain.spec.knob"};
// --- SFT data (text/sft_jsonl.hpp, lm/sft.hpp) ---
inline constexpr ErrorId spec_data_jsonl{"hpctrain.spec.data.jsonl"};
// --- Hugging Face datasets on disk (text/rows.hpp, datasets/) ---
inline constexpr ErrorId spec_data_dataset{"hpctrain.spec.data.dataset"};
// --- several data sources mixed by weight (text/data_mix.hpp, train/data/mix.hpp) ---
inline constexpr ErrorId spec_data_mix{"hpctrain.spec.data.mix"};
inline constexpr ErrorId spec_tokenizer{"hpctrain.spec.tokenizer"};
// --- chat templates (text/chat_template.hpp, text/jinja/) ---
inline constexpr ErrorId spec_chat_template{"hpctrain.spec.chat_template"};
inline constexpr ErrorId runtime_chat_template{"hpctrain.runtime.chat_template"};
inline constexpr ErrorId spec_local{"hpctrain.spec.local"};
inline constexpr ErrorId spec_resume{"hpctrain.spec.resume"};

// --- job description (job/job.hpp, job/container.hpp, job/render.hpp) ---
inline constexpr ErrorId spec_allocation{"hpctrain.spec.allocation"};
inline constexpr ErrorId spec_array{"hpctrain.spec.array"};
inline constexpr ErrorId spec_gpu_syntax{"hpctrain.spec.gpu_syntax"};
inline constexpr ErrorId spec_max_restarts{"hpctrain.spec.max_restarts"};
inline constexpr ErrorId spec_prepare{"hpctrain.spec.prepare"};
inline constexpr ErrorId spec_requeue_signal{"hpctrain.spec.requeue_signal"};
inline constexpr ErrorId spec_site{"hpctrain.spec.site"};
inline constexpr ErrorId spec_fabric{"hpctrain.spec.fabric"};
inline constexpr ErrorId spec_check_fabric_max{"hpctrain.spec.check_fabric_max"};
inline constexpr ErrorId spec_simulated_link{"hpctrain.spec.simulated_link"};
inline constexpr ErrorId spec_sweep{"hpctrain.spec.sweep"};
inline constexpr ErrorId spec_account{"hpctrain.spec.account"};
inline constexpr ErrorId spec_container_command{"hpctrain.spec.container.command"};
inline constexpr ErrorId spec_chdir{"hpctrain.spec.chdir"};
inline constexpr ErrorId spec_constraint{"hpctrain.spec.constraint"};
inline constexpr ErrorId spec_container_env{"hpctrain.spec.container.env"};
inline constexpr ErrorId spec_container_image{"hpctrain.spec.container.image"};
inline constexpr ErrorId spec_container_name{"hpctrain.spec.container.name"};
inline constexpr ErrorId spec_cpus_per_task{"hpctrain.spec.cpus_per_task"};
inline constexpr ErrorId spec_dependency{"hpctrain.spec.dependency"};
inline constexpr ErrorId spec_env{"hpctrain.spec.env"};
inline constexpr ErrorId spec_enroot_output{"hpctrain.spec.enroot.output"};
inline constexpr ErrorId spec_error{"hpctrain.spec.error"};
inline constexpr ErrorId spec_gpus_per_node{"hpctrain.spec.gpus_per_node"};
inline constexpr ErrorId spec_mail_type{"hpctrain.spec.mail_type"};
inline constexpr ErrorId spec_mail_user{"hpctrain.spec.mail_user"};
inline constexpr ErrorId spec_memory{"hpctrain.spec.memory"};
inline constexpr ErrorId spec_memory_per_gpu{"hpctrain.spec.memory_per_gpu"};
inline constexpr ErrorId spec_module{"hpctrain.spec.module"};
inline constexpr ErrorId spec_mount{"hpctrain.spec.mount"};
inline constexpr ErrorId spec_name{"hpctrain.spec.name"};
inline constexpr ErrorId spec_nodes{"hpctrain.spec.nodes"};
inline constexpr ErrorId spec_output{"hpctrain.spec.output"};
inline constexpr ErrorId spec_partition{"hpctrain.spec.partition"};
inline constexpr ErrorId spec_program{"hpctrain.spec.program"};
inline constexpr ErrorId spec_qos{"hpctrain.spec.qos"};
inline constexpr ErrorId spec_requeue_on_timeout{"hpctrain.spec.requeue_on_timeout"};
inline constexpr ErrorId spec_requeue_on_timeout_max_restarts{"hpctrain.spec.requeue_on_timeout.max_restarts"};
inline constexpr ErrorId spec_reservation{"hpctrain.spec.reservation"};
inline constexpr ErrorId spec_resources{"hpctrain.spec.resources"};
inline constexpr ErrorId spec_sbatch_option{"hpctrain.spec.sbatch_option"};
inline constexpr ErrorId spec_setup{"hpctrain.spec.setup"};
inline constexpr ErrorId spec_srun_option{"hpctrain.spec.srun_option"};
inline constexpr ErrorId spec_tasks_per_node{"hpctrain.spec.tasks_per_node"};
inline constexpr ErrorId spec_then{"hpctrain.spec.then"};
inline constexpr ErrorId spec_stage{"hpctrain.spec.stage"};
inline constexpr ErrorId spec_time{"hpctrain.spec.time"};

// --- job layer at run time (job/submit.hpp, job/process.hpp, files.hpp, job/container.hpp) ---
inline constexpr ErrorId runtime_prepare{"hpctrain.runtime.prepare"};
inline constexpr ErrorId runtime_enroot{"hpctrain.runtime.enroot"};
inline constexpr ErrorId runtime_exec{"hpctrain.runtime.exec"};
inline constexpr ErrorId runtime_io{"hpctrain.runtime.io"};
inline constexpr ErrorId runtime_job_record{"hpctrain.runtime.job_record"};
inline constexpr ErrorId runtime_logs{"hpctrain.runtime.logs"};
inline constexpr ErrorId runtime_no_job{"hpctrain.runtime.no_job"};
inline constexpr ErrorId runtime_sbatch{"hpctrain.runtime.sbatch"};
inline constexpr ErrorId runtime_scancel{"hpctrain.runtime.scancel"};
inline constexpr ErrorId runtime_status{"hpctrain.runtime.status"};

// --- slurm layer (slurm/) ---
inline constexpr ErrorId runtime_hostlist{"hpctrain.runtime.hostlist"};
inline constexpr ErrorId runtime_local_launch{"hpctrain.runtime.local_launch"};
inline constexpr ErrorId runtime_cuda_device{"hpctrain.runtime.cuda_device"};
inline constexpr ErrorId runtime_cuda_graph{"hpctrain.runtime.cuda_graph"};
inline constexpr ErrorId runtime_resolve{"hpctrain.runtime.resolve"};
inline constexpr ErrorId runtime_slurm_env{"hpctrain.runtime.slurm_env"};

// --- dist layer (dist/) ---
inline constexpr ErrorId runtime_collective{"hpctrain.runtime.collective"};
inline constexpr ErrorId runtime_gloo{"hpctrain.runtime.gloo"};
inline constexpr ErrorId runtime_gradient_sync{"hpctrain.runtime.gradient_sync"};
inline constexpr ErrorId runtime_rendezvous{"hpctrain.runtime.rendezvous"};
inline constexpr ErrorId runtime_fabric{"hpctrain.runtime.fabric"};

// --- training description (train/training.hpp, train/optim/schedule.hpp, train/data/) ---
inline constexpr ErrorId spec_checkpoint_buffers{"hpctrain.spec.checkpoint.buffers"};
inline constexpr ErrorId spec_checkpoint_parameters{"hpctrain.spec.checkpoint.parameters"};
inline constexpr ErrorId spec_checkpoint_strategy{"hpctrain.spec.checkpoint.strategy"};
inline constexpr ErrorId spec_metrics_top_k_accuracy{"hpctrain.spec.metrics.top_k_accuracy"};
inline constexpr ErrorId spec_optimizer{"hpctrain.spec.optimizer"};
inline constexpr ErrorId spec_reduce_dtype{"hpctrain.spec.reduce_dtype"};
inline constexpr ErrorId spec_sharding{"hpctrain.spec.sharding"};
inline constexpr ErrorId spec_data_tensors{"hpctrain.spec.data.tensors"};
inline constexpr ErrorId spec_tokens_token_bytes{"hpctrain.spec.tokens.token_bytes"};
inline constexpr ErrorId spec_training_eval_step{"hpctrain.spec.training.eval_step"};
inline constexpr ErrorId spec_training_flops_per_example{"hpctrain.spec.training.flops_per_example"};
inline constexpr ErrorId spec_training_peak_flops{"hpctrain.spec.training.peak_flops"};
inline constexpr ErrorId spec_training_preemption_check_every{"hpctrain.spec.training.preemption_check_every"};
inline constexpr ErrorId spec_training_step{"hpctrain.spec.training.step"};
inline constexpr ErrorId spec_training_strategy{"hpctrain.spec.training.strategy"};
inline constexpr ErrorId spec_sampler_rank{"hpctrain.spec.sampler.rank"};
inline constexpr ErrorId spec_schedule_final_fraction{"hpctrain.spec.schedule.final_fraction"};
inline constexpr ErrorId spec_schedule_warmup_steps{"hpctrain.spec.schedule.warmup_steps"};
inline constexpr ErrorId spec_tokens_context{"hpctrain.spec.tokens.context"};
inline constexpr ErrorId spec_training_batch_size{"hpctrain.spec.training.batch_size"};
inline constexpr ErrorId spec_training_checkpoint_every{"hpctrain.spec.training.checkpoint_every"};
inline constexpr ErrorId spec_training_clip_grad_norm{"hpctrain.spec.training.clip_grad_norm"};
inline constexpr ErrorId spec_training_cuda_graphs{"hpctrain.spec.training.cuda_graphs"};
inline constexpr ErrorId spec_training_float8{"hpctrain.spec.training.float8"};
inline constexpr ErrorId spec_training_epochs{"hpctrain.spec.training.epochs"};
inline constexpr ErrorId spec_training_eval_batch_size{"hpctrain.spec.training.eval_batch_size"};
inline constexpr ErrorId spec_training_eval_every{"hpctrain.spec.training.eval_every"};
inline constexpr ErrorId spec_training_gradient_accumulation{"hpctrain.spec.training.gradient_accumulation"};
inline constexpr ErrorId spec_training_keep_checkpoints{"hpctrain.spec.training.keep_checkpoints"};
inline constexpr ErrorId spec_training_log_every{"hpctrain.spec.training.log_every"};
inline constexpr ErrorId spec_training_lr{"hpctrain.spec.training.lr"};
inline constexpr ErrorId spec_training_max_eval_examples{"hpctrain.spec.training.max_eval_examples"};
inline constexpr ErrorId spec_training_max_steps{"hpctrain.spec.training.max_steps"};
inline constexpr ErrorId spec_training_model{"hpctrain.spec.training.model"};
inline constexpr ErrorId spec_training_optimizer{"hpctrain.spec.training.optimizer"};
inline constexpr ErrorId spec_training_threads{"hpctrain.spec.training.threads"};
inline constexpr ErrorId spec_training_train_data{"hpctrain.spec.training.train_data"};
inline constexpr ErrorId spec_wandb{"hpctrain.spec.wandb"};

// --- train layer at run time (train/) ---
inline constexpr ErrorId runtime_batch_field{"hpctrain.runtime.batch.field"};
inline constexpr ErrorId runtime_checkpoint{"hpctrain.runtime.checkpoint"};
inline constexpr ErrorId runtime_data_idx{"hpctrain.runtime.data.idx"};
inline constexpr ErrorId runtime_data_tokens{"hpctrain.runtime.data.tokens"};
inline constexpr ErrorId runtime_metrics{"hpctrain.runtime.metrics"};
inline constexpr ErrorId runtime_run_directory{"hpctrain.runtime.run_directory"};
inline constexpr ErrorId runtime_tensorboard{"hpctrain.runtime.tensorboard"};
inline constexpr ErrorId runtime_wandb{"hpctrain.runtime.wandb"};

// --- text layer (text/, text/prepare_step.hpp) ---
inline constexpr ErrorId spec_prepare_chunk_bytes{"hpctrain.spec.prepare.chunk_bytes"};
inline constexpr ErrorId spec_prepare_inputs{"hpctrain.spec.prepare.inputs"};
inline constexpr ErrorId spec_prepare_threads{"hpctrain.spec.prepare.threads"};
inline constexpr ErrorId spec_prepare_tokenizer{"hpctrain.spec.prepare.tokenizer"};
inline constexpr ErrorId spec_prepare_validation_fraction{"hpctrain.spec.prepare.validation_fraction"};
inline constexpr ErrorId runtime_text_decode{"hpctrain.runtime.text.decode"};
inline constexpr ErrorId runtime_text_input{"hpctrain.runtime.text.input"};
inline constexpr ErrorId runtime_text_prepare{"hpctrain.runtime.text.prepare"};
inline constexpr ErrorId runtime_text_regex{"hpctrain.runtime.text.regex"};
inline constexpr ErrorId runtime_text_sft_tokens{"hpctrain.runtime.text.sft_tokens"};
inline constexpr ErrorId runtime_text_token_file{"hpctrain.runtime.text.token_file"};
inline constexpr ErrorId runtime_text_tokenizer{"hpctrain.runtime.text.tokenizer"};

// --- models (models/): the config fields are families, `hpctrain.spec.gpt2.<field>`, `hpctrain.spec.llama.<field>`,
// `hpctrain.spec.generation.<field>`, `hpctrain.spec.lora.<field>`, `hpctrain.spec.roberta.<field>`, documented as
// patterns in docs/errors.md ---
inline constexpr ErrorId spec_model_type{"hpctrain.spec.model_type"};
inline constexpr ErrorId runtime_generation{"hpctrain.runtime.generation"};
inline constexpr ErrorId runtime_sequence_length{"hpctrain.runtime.sequence_length"};
inline constexpr ErrorId runtime_recompute{"hpctrain.runtime.recompute"};
inline constexpr ErrorId runtime_model_config{"hpctrain.runtime.model_config"};
inline constexpr ErrorId runtime_safetensors{"hpctrain.runtime.safetensors"};
// --- masked-LM data (lm/masked_lm_data.hpp; its options are the family `hpctrain.spec.masking.<field>`) ---
inline constexpr ErrorId runtime_masked_lm{"hpctrain.runtime.masked_lm"};
}  // namespace errors

}  // namespace hpctrain
