#pragma once
// Everything hpctrain offers, for a user's train.cpp: the job (job/), the Slurm world (slurm/), the
// distributed runtime (dist/), the training (train/), the language models (models/) and `hpctrain::run`.
// Pulls in LibTorch; a program that only renders or submits jobs can include the job/ headers alone and
// stay torch-free.
//
// A program that links the runtime compiled apart (hpctrain_add_program: HPCTRAIN_SEPARATE_RUNTIME) gets the
// description only: the Job, the Training and what a description names (its data, optimizer, schedule,
// metrics, the language-model factories and hooks), declared, and `run`. The Trainer, the strategies, the
// checkpoints, the command line, the models and the tokenizers are compiled in the runtime's unit; a program
// that uses one of them directly includes its header (<hpctrain/models/models.hpp>, <hpctrain/job/cli.hpp>,
// <hpctrain/lm/tokens.hpp>...). docs/libtorch.md has the figures.
#include <hpctrain/compiled_runtime.hpp>

#if !HPCTRAIN_RUNTIME_DEFINITIONS
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/version.hpp>

#include <hpctrain/job/container.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/setting.hpp>
#include <hpctrain/job/units.hpp>

#include <hpctrain/train/data/idx.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/losses.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/optim/adamw.hpp>
#include <hpctrain/train/optim/schedule.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/step.hpp>
#include <hpctrain/train/training.hpp>

#include <hpctrain/lm/lm.hpp>

#include <hpctrain/run.hpp>
#else
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/version.hpp>

#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/container.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/setting.hpp>
#include <hpctrain/job/shell.hpp>
#include <hpctrain/job/submit.hpp>
#include <hpctrain/job/units.hpp>

#include <hpctrain/slurm/environment.hpp>
#include <hpctrain/slurm/hostlist.hpp>
#include <hpctrain/slurm/local_launch.hpp>
#include <hpctrain/slurm/world.hpp>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/dist/process_group.hpp>

#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/checkpoint/checkpointing.hpp>
#include <hpctrain/train/checkpoint/digest.hpp>
#include <hpctrain/train/data/idx.hpp>
#include <hpctrain/train/data/prefetch.hpp>
#include <hpctrain/train/data/sampler.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/data/tokens.hpp>
#include <hpctrain/train/evaluation.hpp>
#include <hpctrain/train/loggers/loggers.hpp>
#include <hpctrain/train/loggers/tensorboard.hpp>
#include <hpctrain/train/losses.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/optim/adamw.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>
#include <hpctrain/train/optim/schedule.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/preemption.hpp>
#include <hpctrain/train/progress.hpp>
#include <hpctrain/train/run_directory.hpp>
#include <hpctrain/train/run_setup.hpp>
#include <hpctrain/train/step.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/throughput.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/training.hpp>
#include <hpctrain/train/worker.hpp>

#include <hpctrain/lm/lm.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/text/default_data.hpp>

#include <hpctrain/run.hpp>
#endif
