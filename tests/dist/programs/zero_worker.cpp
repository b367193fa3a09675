// One rank of the sharded-strategy tests (tests/dist/zero_test.cpp starts 1–4 of these). It drives a
// DataParallelStrategy through the seam in the Trainer's documented order (zero_grad; per micro-batch
// set_sync(last) + forward/backward; finish_gradients; clip_grad_norm; step) and checks its property itself;
// what the parent compares across runs is printed as `key=value` lines.
// The model lists its two hidden layers as blocks (hpctrain::ListsBlocks) so that ZeRO-3 can shard by them; the
// head is the one unit outside the blocks.
// A stage is zero1, zero2, zero3 or hsdp:<group size> (hybrid sharding: ZeRO-3 within groups of that many ranks).
//   zero_worker equivalence <zero1|zero2|zero3|hsdp:S> <steps> <accumulation> [adamw|sgd]
//       ZeRO parameters after <steps> AdamW (or SGD) steps (clipping on) equal Replicated's (GradientSync + the
//       optimizer on the whole model + torch::nn::utils::clip_grad_norm_) within equivalence_bound relative
//   zero_worker gpt2-bf16 <steps> <accumulation> [recompute|selective] [untied]
//       ZeRO-3 under bf16 (bf16 gathers, fp32 reduce-scatters every micro-batch) against Replicated under bf16
//       autocast, from the same GPT-2 and data: gradient norms and parameters within bf16's bounds, the gathered
//       blocks held in 2 bytes an element, no master copy
//   zero_worker gpt2-equivalence <zero2|zero3> <steps> <accumulation> <export_dir> [recompute|selective] [untied]
//       the same with a small GPT-2 (tied embeddings, dropout on) and SGD with momentum; then every rank takes part in
//       the export unit by unit (fp32 into <export_dir>, bf16 into <export_dir>/bf16, in shards of 8000 bytes), and
//       rank 0 loads them back and checks them against the gathered module, bit for bit; under
//       zero3 every rank then loads the export with empty blocks and a fresh ZeRO-3 reads its own slices of them
//   zero_worker no-blocks                    ZeRO-3 on a module that lists no blocks is refused at setup
//   zero_worker train <zero1|zero2|zero3> <dir> <save_at|-1> <steps> [resume_from_world resume_step]
//       trains steps [start, steps) on a fixed global batch per step (24 rows split over the ranks),
//       prints loss_<step>=<hex float>; saves a sharded checkpoint into <dir> after step <save_at>;
//       resumes from the checkpoint in <dir> written by <resume_from_world> ranks after <resume_step> (ZeRO-3:
//       gathering no block)
//   zero_worker lbfgs <zero1|zero2>          a non-elementwise optimizer is refused at setup
//   zero_worker other-model <zero2> <dir> <world>  resuming a checkpoint of another model is refused
//   zero_worker format1 <dir> [missing-piece|short-piece]  each rank rewrites its file of the checkpoint in <dir> as
//       zero_index format 1 (the pieces inside the archive), as the writer before the pieces region laid it out;
//       rank 1 leaves its piece 1 out or writes it one element short
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <hpctrain/checksums.hpp>
#include <hpctrain/dist/dist.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/hf/hf_export.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/checkpoint/digest.hpp>
#include <hpctrain/train/strategies/sharded.hpp>

namespace dist = hpctrain::dist;
namespace fs = std::filesystem;
using hpctrain::NamedParameters;

namespace {

constexpr std::int64_t global_rows = 24;  // divisible by 1, 2, 3 and 4: every world size sees the same batch
constexpr std::int64_t features = 16;
constexpr std::int64_t classes = 5;

/// Odd widths: buckets that do not divide by 2 or 3, so shards are padded and parameters straddle ranks. The
/// layers are registered as "0", "2", "4", the names torch::nn::Sequential(Linear, Tanh, Linear, ReLU, Linear)
/// gives them; the two hidden layers are the blocks (the first takes the raw data: no input gradient).
struct BlockNetImpl : torch::nn::Module, hpctrain::ListsBlocks {
  explicit BlockNetImpl(std::int64_t hidden)
      : first(register_module("0", torch::nn::Linear(features, hidden))),
        second(register_module("2", torch::nn::Linear(hidden, 17))),
        head(register_module("4", torch::nn::Linear(17, classes))) {}
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override { return {first.ptr(), second.ptr()}; }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = run_block(
        0, [this](const torch::Tensor& in) { return torch::tanh(first(in)); }, x);
    h = run_block(
        1, [this](const torch::Tensor& in) { return torch::relu(second(in)); }, h);
    return head(h);
  }
  torch::nn::Linear first, second, head;
};
TORCH_MODULE(BlockNet);

BlockNet make_model(std::int64_t hidden = 33) { return BlockNet(hidden); }

std::pair<torch::Tensor, torch::Tensor> global_batch(int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto inputs = torch::randn({global_rows, features}, generator);
  auto targets = torch::randint(0, classes, {global_rows}, generator);
  return {inputs, targets};
}

/// Small buckets: several buckets (several collectives) on this small model.
dist::GradientSyncOptions small_buckets() {
  dist::GradientSyncOptions options;
  options.first_bucket_bytes = 1024;
  options.bucket_bytes = 2048;
  return options;
}

/// AdamW with the usual recipe: no weight decay on biases (chosen by name, which shards keep).
std::unique_ptr<torch::optim::Optimizer> make_adamw(const NamedParameters& named) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& [name, tensor] : named)
    (name.find("bias") != std::string::npos ? no_decay : decay).push_back(tensor);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto options = [](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(weight_decay));
  };
  groups.emplace_back(decay, options(0.1));
  groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
}

int hsdp_group_size = 0;  // the S of a stage named hsdp:S (0: the ranks of a node)

hpctrain::ZeroStage stage_of(const std::string& name) {
  const auto colon = name.find(':');
  const auto stage = hpctrain::zero_stage_from_name(name.substr(0, colon));
  if (!stage || *stage == hpctrain::no_sharding || (colon != std::string::npos) != (*stage == hpctrain::hsdp))
    throw std::invalid_argument("stage must be zero1, zero2, zero3 or hsdp:<group size>, not " + name);
  if (*stage == hpctrain::hsdp) hsdp_group_size = std::stoi(name.substr(colon + 1));
  return *stage;
}

/// The name() of the strategy a stage argument makes: hsdp:2 is "hsdp".
std::string strategy_name(const std::string& stage) { return stage.substr(0, stage.find(':')); }

std::unique_ptr<hpctrain::DataParallelStrategy> make_strategy(hpctrain::ZeroStage stage) {
  return hpctrain::make_zero_strategy(stage, small_buckets(), hsdp_group_size);
}

/// Optimizer-state bytes this rank holds, from either sharded strategy.
std::size_t optimizer_state_bytes(const hpctrain::DataParallelStrategy& strategy) {
  if (const auto* zero = dynamic_cast<const hpctrain::ZeroStrategy*>(&strategy)) return zero->optimizer_state_bytes();
  return dynamic_cast<const hpctrain::FullyShardedStrategy&>(strategy).optimizer_state_bytes();
}

dist::Options options_from_environment() {
  dist::Options options;
  if (const char* timeout = std::getenv("HPCTRAIN_DIST_TIMEOUT_MS"))
    options.timeouts(std::chrono::milliseconds(std::stol(timeout)));
  return options;
}

/// This rank's rows of micro-batch `micro` of `accumulation`.
std::pair<torch::Tensor, torch::Tensor> micro_batch(int step, int rank, int world, int micro, int accumulation) {
  auto [inputs, targets] = global_batch(step);
  const auto per_rank = global_rows / world;
  const auto per_micro = per_rank / accumulation;
  const auto first = rank * per_rank + micro * per_micro;
  return {inputs.narrow(0, first, per_micro), targets.narrow(0, first, per_micro)};
}

/// One step through the seam, in the Trainer's order; returns the mean loss of this rank's rows.
double strategy_step(hpctrain::DataParallelStrategy& strategy, BlockNet& model, int step, int rank, int world,
                     int accumulation, double max_norm, double* grad_norm = nullptr) {
  strategy.zero_grad();
  double loss_sum = 0;
  for (int micro = 0; micro < accumulation; ++micro) {
    strategy.set_sync(micro == accumulation - 1);
    auto [inputs, targets] = micro_batch(step, rank, world, micro, accumulation);
    auto loss = torch::nn::functional::cross_entropy(model->forward(inputs), targets);
    (loss / accumulation).backward();
    loss_sum += loss.item<double>();
  }
  strategy.finish_gradients();
  auto norm = strategy.clip_grad_norm(max_norm);
  if (grad_norm) *grad_norm = norm.item<double>();
  strategy.step();
  return loss_sum / accumulation;
}

/// How far a sharded strategy's parameters may drift from Replicated's after the equivalence runs, relative to
/// the parameter's largest magnitude. Both sides compute the same sums in another order (the gradients over
/// the ranks, the clipping norm over the shards), and LibTorch picks kernels by the CPU's vector width, so the
/// order differs between machines as well. In the GPT-2 run one gradient element sums B = 144 token terms
/// (12 rows x 12 tokens; the MLP run's sums are shorter); in fp32 (eps = 6e-8) its rounding is
/// ~sqrt(B) * eps = 7e-7 of the sum of |terms| (Higham's probabilistic bound; the worst case B * eps = 9e-6).
/// Summed over 50 steps with momentum, relative to a parameter that training moved from zero (the LayerNorm
/// biases), that gives the 1e-6 level seen: up to 1.11e-6 on an Intel Xeon with AVX-512 (h.1.ln_2.bias), under
/// 1e-6 on AMD EPYC without it. 1e-5 leaves ~10x for cancellation within the sums and other CPUs; a wrong
/// shard, reduction or step is off by 1e-2 or more.
constexpr double equivalence_bound = 1e-5;

/// SGD with momentum: unlike Adam, not invariant to the scale of the gradients, so it sees any error in clipping.
std::unique_ptr<torch::optim::Optimizer> make_sgd(const NamedParameters& named) {
  std::vector<torch::Tensor> tensors;
  for (const auto& item : named) tensors.push_back(item.second);
  return std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
}

int check_equivalence(const std::shared_ptr<dist::ProcessGroup>& group, hpctrain::ZeroStage stage, int steps,
                      int accumulation, const std::string& optimizer_name) {
  const hpctrain::OptimizerFactory make_optimizer =
      optimizer_name == "sgd" ? hpctrain::OptimizerFactory(make_sgd) : hpctrain::OptimizerFactory(make_adamw);
  const int rank = group->rank(), world = group->world_size();
  constexpr double max_norm = 0.35;  // about the median gradient norm here: clipping is active on half the steps
  torch::manual_seed(5 + rank);      // different initialisation per rank: setup's broadcast must fix it
  auto model = make_model();
  auto reference = make_model();
  {
    torch::NoGradGuard no_grad;
    auto from = model->parameters();
    auto to = reference->parameters();
    for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  auto strategy = make_strategy(stage);
  strategy->setup({group, model.ptr(), make_optimizer});

  // Replicated: our DDP + the optimizer over the whole model + LibTorch's clipping.
  dist::GradientSync sync(group, *reference, small_buckets());
  NamedParameters named;
  for (const auto& item : reference->named_parameters()) named.emplace_back(item.key(), item.value());
  auto optimizer = make_optimizer(named);

  double worst_norm_difference = 0;
  for (int step = 0; step < steps; ++step) {
    double norm = 0;
    strategy_step(*strategy, model, step, rank, world, accumulation, max_norm, &norm);

    optimizer->zero_grad();
    for (int micro = 0; micro < accumulation; ++micro) {
      sync.set_sync(micro == accumulation - 1);
      auto [inputs, targets] = micro_batch(step, rank, world, micro, accumulation);
      (torch::nn::functional::cross_entropy(reference->forward(inputs), targets) / accumulation).backward();
    }
    sync.finish();
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm);
    optimizer->step();
    worst_norm_difference = std::max(worst_norm_difference, std::abs(norm - reference_norm) / reference_norm);
  }

  bool ok = worst_norm_difference < 1e-5;
  strategy->gather_full_model();  // ZeRO-3: the blocks whole in the module (a no-op for ZeRO-1/2)
  double worst = 0;
  auto ours = model->named_parameters();
  auto theirs = reference->parameters();
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto& a = ours[i].value();
    const auto& b = theirs[i];
    // Relative to the parameter's magnitude: max |a - b| / max |b|.
    const double relative = ((a - b).abs().max() / b.abs().max()).item<double>();
    worst = std::max(worst, relative);
    if (!(relative <= equivalence_bound)) {
      std::cerr << fmt::format("rank {}: {} differs from Replicated by {:.3e} relative\n", rank, ours[i].key(),
                               relative);
      ok = false;
    }
  }
  // Every rank holds the same full parameters after the all-gather: compare with rank 0 bit for bit.
  std::vector<torch::Tensor> flat;
  for (auto& parameter : model->parameters()) flat.push_back(parameter.detach().reshape({-1}));
  auto mine = torch::cat(flat);
  auto rank0 = mine.clone();
  if (world > 1) {
    std::vector<torch::Tensor> buffer{rank0};
    group->backend()->broadcast(buffer, c10d::BroadcastOptions{})->wait();
  }
  if (!torch::equal(mine, rank0)) {
    std::cerr << fmt::format("rank {}: parameters differ from rank 0's\n", rank);
    ok = false;
  }
  // ZeRO-3 over fp32 parameters steps its shards themselves: no master copy beside them.
  if (const auto* full = dynamic_cast<const hpctrain::FullyShardedStrategy*>(strategy.get())) {
    std::cout << fmt::format("master_bytes={}\n", full->master_bytes());
    // What a rank holds of the units (blocks), and what crossed the replica group: each unit's gradient shard
    // once per step.
    std::int64_t unit_shard = 0, unit_padded = 0, all_shards = 0;
    const auto& buckets = full->layout().buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      all_shards += buckets[b].shard_numel;
      if (b >= full->sharded_unit_count()) continue;
      unit_shard += buckets[b].shard_numel;
      unit_padded += buckets[b].padded_numel;
    }
    const auto& replicas = full->replica_group();
    std::cout << fmt::format(
        "shard_group_size={}\nreplica_group_size={}\nunit_shard_elements={}\nunit_padded_elements={}\n"
        "replica_reduced_bytes_per_shard_element={:g}\n",
        full->shard_group()->world_size(), replicas ? replicas->world_size() : 1, unit_shard, unit_padded,
        static_cast<double>(full->replica_reduced_bytes()) / static_cast<double>(steps * all_shards));
  }
  std::cout
      << fmt::format(
             "max_relative_difference={:.3e}\nrelative_difference_bound={:.0e}\nmax_grad_norm_difference={:.3e}\n",
             worst, equivalence_bound, worst_norm_difference)
      << fmt::format("optimizer_state_bytes={}\nreplicated_optimizer_state_bytes={}\n",
                     optimizer_state_bytes(*strategy),
                     [&] {
                       std::size_t bytes = 0;
                       for (auto& [key, state] : optimizer->state())
                         bytes += hpctrain::detail::state_tensor_bytes(*state);
                       return bytes;
                     }())
      << std::flush;
  return ok ? 0 : 1;
}

// --- checkpoint files as the Trainer lays them out (docs/seams.md): rank-<5 digits>.hpct, written and read by the
// checkpoint layer's own functions (header, archive, pieces region; each checked as it is read) without meta.json. ---

fs::path archive_path(const fs::path& directory, int rank) { return directory / fmt::format("rank-{:05d}.hpct", rank); }

void write_archive(const fs::path& path, torch::serialize::OutputArchive& archive, hpctrain::PieceWriter pieces,
                   std::int64_t step) {
  auto serialized = hpctrain::detail::serialize_archive(archive, std::move(pieces));
  hpctrain::detail::seal_archive(serialized, step, 0);
  hpctrain::detail::write_sealed(path, serialized);
}

/// `opened`: the ranks whose archives the load opened, in order; `piece_bytes`: the bytes of the element ranges the
/// load asked of their pieces.
hpctrain::SavedStrategyState saved_state(const fs::path& directory, int world, const std::string& strategy,
                                         std::vector<int>& opened, std::int64_t& piece_bytes) {
  auto saved = hpctrain::detail::saved_strategy_state(
      std::make_shared<hpctrain::detail::CheckpointFiles>(directory, std::nullopt), world, strategy);
  saved.open = [open = saved.open, &opened](int rank) {
    opened.push_back(rank);
    return open(rank);
  };
  saved.read_piece = [read = saved.read_piece, &piece_bytes](int rank, std::int64_t piece, std::int64_t begin,
                                                             std::int64_t length) {
    auto values = read(rank, piece, begin, length);
    piece_bytes += static_cast<std::int64_t>(values.nbytes());
    return values;
  };
  return saved;
}

/// CRC-32C of the whole model's parameters (ZeRO-3: gathered), the same on every rank.
std::uint32_t model_digest(hpctrain::DataParallelStrategy& strategy, torch::nn::Module& model) {
  strategy.gather_full_model();
  return hpctrain::detail::parameters_digest(model);
}

/// CRC-32C of this rank's optimizer state: every state entry of every parameter the optimizer steps (this rank's
/// masters), in the order of its parameter groups, tensors by their bytes. Two ranks holding the same pieces hold
/// the same state exactly when their digests agree.
std::uint32_t optimizer_digest(hpctrain::DataParallelStrategy& strategy) {
  auto& optimizer = strategy.optimizer();
  std::string bytes;
  for (const auto& group : optimizer.param_groups())
    for (const auto& parameter : group.params()) {
      const auto found = optimizer.state().find(parameter.unsafeGetTensorImpl());
      if (found == optimizer.state().end()) continue;
      for (const auto& [key, value] : hpctrain::detail::state_entries(*found->second)) {
        bytes += key;
        if (value.isTensor() && value.toTensor().defined()) {
          const auto tensor = value.toTensor().contiguous().to(torch::kCPU);
          bytes.append(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
        } else {
          bytes += value.isInt()      ? std::to_string(value.toInt())
                   : value.isDouble() ? fmt::format("{:a}", value.toDouble())
                                      : std::string(value.tagKind());
        }
      }
    }
  return hpctrain::detail::crc32c(bytes);
}

/// `saved_strategy`: the name() of the strategy that wrote the checkpoint resumed from (ZeRO-2 and ZeRO-3 read
/// each other's).
int train(const std::shared_ptr<dist::ProcessGroup>& group, hpctrain::ZeroStage stage, const fs::path& directory,
          int save_at, int steps, int resume_world, int resume_step, std::int64_t hidden = 33,
          std::string saved_strategy = "") {
  if (saved_strategy.empty()) saved_strategy = hpctrain::to_string(stage);
  saved_strategy = strategy_name(saved_strategy);
  const int rank = group->rank(), world = group->world_size();
  torch::manual_seed(resume_world > 0 ? 99 + rank : 5);  // a resumed run starts from other weights: load must fix them
  auto model = make_model(hidden);
  auto strategy = make_strategy(stage);
  strategy->setup({group, model.ptr(), make_adamw});
  int start = 0;
  if (resume_world > 0) {
    std::vector<int> opened;
    std::int64_t piece_bytes = 0;
    strategy->load(saved_state(directory, resume_world, saved_strategy, opened, piece_bytes));
    std::cout << fmt::format("rank {} opened_archives={}\n", rank, fmt::join(opened, ",")) << std::flush;
    start = resume_step + 1;
    // ZeRO-3 keeps only what falls in its shards: loading gathers no block.
    const auto* full = dynamic_cast<const hpctrain::FullyShardedStrategy*>(strategy.get());
    if (full != nullptr && full->peak_gathered_bytes() > 0) {
      std::cerr << fmt::format("rank {}: loading gathered {} bytes of blocks\n", rank, full->peak_gathered_bytes());
      return 1;
    }
    // What the load read of the pieces, beside what this rank holds: its masters (4 bytes an element) and AdamW's
    // two moments (8), i.e. 1.5 times its optimizer state.
    std::cout << fmt::format("rank {} piece_bytes_read={}\nrank {} optimizer_state_bytes={}\n", rank, piece_bytes, rank,
                             optimizer_state_bytes(*strategy))
              << fmt::format("rank {} loaded_digest={:08x}\n", rank, model_digest(*strategy, *model))
              << fmt::format("rank {} loaded_state_digest={:08x}\n", rank, optimizer_digest(*strategy)) << std::flush;
  }
  for (int step = start; step < steps; ++step) {
    const double local = strategy_step(*strategy, model, step, rank, world, 2, 0.5);
    const double loss = dist::all_reduce_sum(*group, local) / world;
    if (rank == 0) std::cout << fmt::format("loss_{}={:a}\n", step, loss) << std::flush;
    if (step == save_at) {
      fs::create_directories(directory);
      torch::serialize::OutputArchive archive;
      hpctrain::PieceWriter pieces;
      strategy->save(archive, pieces);
      write_archive(archive_path(directory, rank), archive, std::move(pieces), step);
      dist::barrier(*group);
      std::cout << fmt::format("rank {} saved_digest={:08x}\n", rank, model_digest(*strategy, *model))
                << fmt::format("rank {} saved_state_digest={:08x}\n", rank, optimizer_digest(*strategy)) << std::flush;
    }
  }
  return 0;
}

// --- zero_index format 1, as save_zero_shard wrote it before the pieces region (before 2026-11-26, commit 64b072d):
// a format-1 file (header and archive, nothing after it) whose archive holds zero_index (format 1: no piece ids),
// then for each piece i zero_piece_<i> (its fp32 master, flat) and, once stepped, zero_state_<i> (the optimizer's
// OptimizerParamState::serialize of it: Adam's step and both moments, whole), then rank 0's zero_buffer_<k>. ---

/// Rewrites rank `rank`'s format-2 file in `directory` as the format-1 writer laid it out, from the same bytes: the
/// pieces' values and elementwise state read back from the pieces region, the per-parameter state from the archive.
/// `defect`: "missing-piece" leaves zero_piece_1 out, "short-piece" writes it one element short.
void rewrite_as_format1(const fs::path& directory, int rank, const std::string& defect) {
  hpctrain::detail::CheckpointFiles files(directory, std::nullopt);
  auto saved = files.open(rank);
  c10::IValue text;
  saved.read("zero_index", text);
  const auto index = nlohmann::json::parse(text.toStringRef());
  // The old index (shard_index): no piece ids, no has_state.
  nlohmann::json old = index;
  old["format"] = 1;
  for (auto& piece : old["pieces"])
    piece = {{"parameter", piece["parameter"]}, {"begin", piece["begin"]}, {"length", piece["length"]}};
  torch::serialize::OutputArchive archive;
  archive.write("zero_index", c10::IValue(old.dump()));
  const auto& pieces = index.at("pieces");
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const auto length = pieces[i].at("length").get<std::int64_t>();
    auto values = files.read_piece(rank, pieces[i].at("values").get<std::int64_t>(), 0, length);
    if (i == 1 && defect == "short-piece") values = values.narrow(0, 0, length - 1);
    if (!(i == 1 && defect == "missing-piece")) archive.write(fmt::format("zero_piece_{}", i), values);
    if (!pieces[i].value("has_state", false)) continue;
    torch::serialize::OutputArchive state(archive.compilation_unit());
    torch::serialize::InputArchive per_parameter;
    saved.read(fmt::format("zero_state_{}", i), per_parameter);
    for (const auto& key : per_parameter.keys()) {
      c10::IValue value;
      per_parameter.read(key, value);
      state.write(key, value);
    }
    for (const auto& [key, id] : pieces[i].at("state").items())
      state.write(key, c10::IValue(files.read_piece(rank, id.get<std::int64_t>(), 0, length)));
    archive.write(fmt::format("zero_state_{}", i), state);
  }
  for (std::size_t k = 0; k < index.at("buffers").size(); ++k) {
    torch::Tensor buffer;
    saved.read(fmt::format("zero_buffer_{}", k), buffer, /*is_buffer=*/true);
    archive.write(fmt::format("zero_buffer_{}", k), buffer, /*is_buffer=*/true);
  }
  write_archive(archive_path(directory, rank), archive, {}, 5);  // no pieces: a format-1 file
}

// --- a small GPT-2 (tied embeddings, dropout on): the blocks of a real model, exported from a sharded run ----

/// Tied (GPT-2's own: the one weight outside the blocks) or not (the token embedding and the head are then the
/// model's edges, which ZeRO-3 shards like blocks).
hpctrain::models::GPT2Config tiny_gpt2(bool tied) {
  hpctrain::models::GPT2Config config;
  config.tie_word_embeddings = tied;
  config.vocab_size = 61;  // odd sizes: padded shards
  config.n_positions = 16;
  config.n_embd = 20;
  config.n_layer = 3;
  config.n_head = 2;
  config.bos_token_id = config.eos_token_id = 60;
  return config;
}

/// This rank's token rows of micro-batch `micro` (12 global rows of 12 tokens per step).
torch::Tensor token_batch(int step, int rank, int world, int micro, int accumulation) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(2000 + step);
  auto tokens = torch::randint(0, 61, {12, 13}, generator);
  const auto per_micro = 12 / world / accumulation;
  return tokens.narrow(0, rank * (12 / world) + micro * per_micro, per_micro);
}

torch::Tensor lm_loss(hpctrain::models::GPT2& model, const torch::Tensor& tokens) {
  auto logits = model->forward(tokens.narrow(1, 0, 12));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, 61}), tokens.narrow(1, 1, 12).reshape({-1}));
}

/// Two tiny GPT-2s with equal weights: the one a strategy trains, and Replicated's reference.
std::pair<hpctrain::models::GPT2, hpctrain::models::GPT2> equal_gpt2s(bool tied) {
  torch::manual_seed(7);
  hpctrain::models::GPT2 model(tiny_gpt2(tied)), reference(tiny_gpt2(tied));
  torch::NoGradGuard no_grad;
  auto from = model->parameters();
  auto to = reference->parameters();
  for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  return {model, reference};
}

/// Trains `model` through `strategy` (set up) and `reference` through Replicated (GradientSync + the same SGD),
/// `steps` steps of `accumulation` micro-batches with clipping, both forwards under `precision`; returns the worst
/// relative difference of the two gradient norms.
double train_gpt2_beside_replicated(const std::shared_ptr<dist::ProcessGroup>& group,
                                    hpctrain::DataParallelStrategy& strategy, hpctrain::models::GPT2& model,
                                    hpctrain::models::GPT2& reference, int steps, int accumulation,
                                    hpctrain::Precision precision) {
  const int rank = group->rank(), world = group->world_size();
  constexpr double max_norm = 0.5;
  dist::GradientSync sync(group, *reference, small_buckets());
  NamedParameters named;
  for (const auto& item : reference->named_parameters()) named.emplace_back(item.key(), item.value());
  auto optimizer = make_sgd(named);
  const torch::Device cpu(torch::kCPU);
  double worst_norm_difference = 0;
  for (int step = 0; step < steps; ++step) {
    // Same dropout masks on both sides: the same seed before each micro-batch's forward.
    strategy.zero_grad();
    for (int micro = 0; micro < accumulation; ++micro) {
      strategy.set_sync(micro == accumulation - 1);
      torch::manual_seed(100000 + 1000 * step + 10 * micro + rank);
      hpctrain::AutocastScope autocast(precision, cpu);
      (lm_loss(model, token_batch(step, rank, world, micro, accumulation)) / accumulation).backward();
    }
    strategy.finish_gradients();
    const double norm = strategy.clip_grad_norm(max_norm).item<double>();
    strategy.step();

    optimizer->zero_grad();
    for (int micro = 0; micro < accumulation; ++micro) {
      sync.set_sync(micro == accumulation - 1);
      torch::manual_seed(100000 + 1000 * step + 10 * micro + rank);
      hpctrain::AutocastScope autocast(precision, cpu);
      (lm_loss(reference, token_batch(step, rank, world, micro, accumulation)) / accumulation).backward();
    }
    sync.finish();
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm);
    optimizer->step();
    worst_norm_difference = std::max(worst_norm_difference, std::abs(norm - reference_norm) / reference_norm);
  }
  return worst_norm_difference;
}

/// The worst max |ours - theirs| / max |theirs| over the parameters; names each beyond `bound` on stderr.
double worst_relative_difference(hpctrain::models::GPT2& model, hpctrain::models::GPT2& reference, double bound,
                                 int rank, bool& ok) {
  double worst = 0;
  auto ours = model->named_parameters();
  auto theirs = reference->parameters();
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const double relative = ((ours[i].value() - theirs[i]).abs().max() / theirs[i].abs().max()).item<double>();
    worst = std::max(worst, relative);
    if (!(relative <= bound)) {
      std::cerr << fmt::format("rank {}: {} differs from Replicated by {:.3e} relative\n", rank, ours[i].key(),
                               relative);
      ok = false;
    }
  }
  return worst;
}

/// The blocks' (and edges') collective bytes, counted where they are issued, per element and micro-batch, as
/// `gathered_bytes_per_block_element=` and `reduce_scattered_bytes_per_block_element=` lines.
std::string block_traffic_lines(const hpctrain::FullyShardedStrategy& strategy, int steps, int accumulation) {
  double block_elements = 0;
  for (std::size_t b = 0; b < strategy.sharded_unit_count(); ++b)
    block_elements += static_cast<double>(strategy.layout().buckets()[b].padded_numel);
  const double per = block_elements * steps * accumulation;
  return fmt::format("gathered_bytes_per_block_element={:g}\nreduce_scattered_bytes_per_block_element={:g}\n",
                     static_cast<double>(strategy.block_traffic().gathered) / per,
                     static_cast<double>(strategy.block_traffic().reduce_scattered) / per);
}

/// One more forward with grad: with activations kept, every block's gathered buffer is freed after the forward
/// though autograd still refers to it (no memory held, `held_buffers=` blocks); with recomputation none is held.
/// Then its backward, and the step's release.
std::string held_after_forward(const std::shared_ptr<dist::ProcessGroup>& group,
                               hpctrain::FullyShardedStrategy& strategy, hpctrain::models::GPT2& model,
                               hpctrain::Precision precision) {
  strategy.zero_grad();
  hpctrain::AutocastScope autocast(precision, torch::Device(torch::kCPU));
  auto loss = lm_loss(model, token_batch(0, group->rank(), group->world_size(), 0, 1));
  const auto held = strategy.held_buffers();
  const auto bytes = strategy.held_bytes();
  loss.backward();
  strategy.zero_grad();
  return fmt::format("held_buffers={}\nheld_bytes={}\n", held, bytes);
}

/// Every rank loads rank 0's export with its blocks left empty and a fresh ZeRO-3 reads its own slices of them
/// (GPT-2's transposed projections, shards padded and straddling parameters at world 3): gathered, the model
/// equals the one exported, bit for bit.
bool check_deferred_load(const std::shared_ptr<dist::ProcessGroup>& group, const fs::path& export_dir,
                         hpctrain::models::GPT2& exported) {
  dist::all_reduce_sum(*group, 1.0);  // rank 0 has written the export
  auto deferred = hpctrain::models::load_gpt2_deferred(export_dir);
  bool ok = deferred->deferred_blocks() != nullptr && deferred->blocks().front()->parameters().front().numel() == 0;
  hpctrain::FullyShardedStrategy strategy(small_buckets());
  strategy.setup({group, deferred.ptr(), make_sgd});
  ok = ok && deferred->deferred_blocks() == nullptr;  // taken by the strategy, the checkpoint's mapping with it
  strategy.gather_full_model();
  auto expected = exported->named_parameters();
  for (const auto& item : deferred->named_parameters())
    if (!torch::equal(expected[item.key()], item.value())) {
      std::cerr << fmt::format("rank {}: {} read in slices differs from the exported model's\n", group->rank(),
                               item.key());
      ok = false;
    }
  std::cout << fmt::format("deferred_load_equal={}\n", ok ? 1 : 0);
  return ok;
}

/// The most bytes of a shard of the tiny GPT-2's exports: a block's weights are ~5,000 elements, so fp32 blocks
/// spread over several shards and a few tensors straddle none (each starts a shard or fits its rest).
constexpr std::uint64_t export_shard_bytes = 8000;

/// Every rank takes part in the export that streams the model unit by unit (DataParallelStrategy::visit_units);
/// rank 0 writes it into `directory` in `dtype`, in shards of export_shard_bytes. Under ZeRO-3, prints the most
/// bytes gathered at once during the export beside the largest unit's (fp32): a whole-model gather holds them all.
void export_by_units(hpctrain::DataParallelStrategy& strategy, hpctrain::models::GPT2& model, const fs::path& directory,
                     torch::Dtype dtype, int rank) {
  auto* full = dynamic_cast<hpctrain::FullyShardedStrategy*>(&strategy);
  if (full != nullptr) full->reset_peak_gathered_bytes();
  const auto order = strategy.unit_shapes(*model);
  const auto visit = [&](const hpctrain::models::UnitVisitor& visitor) { strategy.visit_units(*model, visitor); };
  if (rank == 0)
    hpctrain::models::save_pretrained_by_units(*model, order, visit, directory, {dtype, export_shard_bytes});
  else visit([](const hpctrain::models::NamedUnit&) {});
  if (full == nullptr) return;
  std::size_t largest = 0, all = 0;
  for (std::size_t b = 0; b < full->sharded_unit_count(); ++b) {
    const auto bytes = 4 * static_cast<std::size_t>(full->layout().buckets()[b].padded_numel);
    largest = std::max(largest, bytes);
    all += bytes;
  }
  std::cout << fmt::format(
      "export_peak_gathered_bytes={}\nlargest_unit_bytes={}\nall_units_bytes={}\ngathered_after_export={}\n",
      full->peak_gathered_bytes(), largest, all, full->gathered_bytes());
}

/// Rank 0's exports against the gathered model: the fp32 one loads back equal bit for bit, the bf16 one equals
/// the model rounded to bf16 (the same round-to-nearest-even conversion), and their indexes name every shard.
bool check_exports(hpctrain::models::GPT2& model, const fs::path& fp32_dir, const fs::path& bf16_dir) {
  bool ok = fs::exists(fp32_dir / "model.safetensors.index.json") && !fs::exists(fp32_dir / "model.safetensors");
  auto fp32 = hpctrain::models::load_gpt2(fp32_dir)->named_parameters();
  auto bf16 = hpctrain::models::load_gpt2(bf16_dir, torch::kBFloat16)->named_parameters();
  for (const auto& item : model->named_parameters()) {
    if (!torch::equal(fp32[item.key()], item.value())) {
      std::cerr << fmt::format("exported {} differs from the gathered module's\n", item.key());
      ok = false;
    }
    if (!torch::equal(bf16[item.key()], item.value().to(torch::kBFloat16))) {
      std::cerr << fmt::format("the bf16 export's {} is not the gathered module's rounded to bf16\n", item.key());
      ok = false;
    }
  }
  std::size_t shards = 0;
  for (const auto& entry : fs::directory_iterator(fp32_dir))
    shards += entry.path().filename().string().starts_with("model-") ? 1 : 0;
  std::cout << fmt::format("export_shards={}\n", shards);
  return ok;
}

int check_gpt2_equivalence(const std::shared_ptr<dist::ProcessGroup>& group, hpctrain::ZeroStage stage, int steps,
                           int accumulation, const fs::path& export_dir, hpctrain::models::Recompute recompute,
                           bool tied) {
  const int rank = group->rank();
  auto [model, reference] = equal_gpt2s(tied);
  model->set_activation_checkpointing(recompute);
  auto strategy = make_strategy(stage);
  strategy->setup({group, model.ptr(), make_sgd});
  const double worst_norm_difference =
      train_gpt2_beside_replicated(group, *strategy, model, reference, steps, accumulation, hpctrain::Precision::fp32);
  bool ok = worst_norm_difference < 1e-5;
  if (const auto* full = dynamic_cast<const hpctrain::FullyShardedStrategy*>(strategy.get()))
    std::cout << block_traffic_lines(*full, steps, accumulation)
              << fmt::format("sharded_units={}\n", full->sharded_unit_count());
  // Exported unit by unit before anything gathers the whole model, in fp32 and in bf16.
  export_by_units(*strategy, model, export_dir, torch::kFloat32, rank);
  export_by_units(*strategy, model, export_dir / "bf16", torch::kBFloat16, rank);
  strategy->gather_full_model();
  const double worst = worst_relative_difference(model, reference, equivalence_bound, rank, ok);
  if (rank == 0) {  // load the exports back: the gathered model's tensors
    ok = check_exports(model, export_dir, export_dir / "bf16") && ok;
    std::cout << "exported=" << export_dir.string() << "\n";
  }
  if (stage == hpctrain::zero3) ok = check_deferred_load(group, export_dir, model) && ok;
  std::cout
      << fmt::format(
             "max_relative_difference={:.3e}\nrelative_difference_bound={:.0e}\nmax_grad_norm_difference={:.3e}\n",
             worst, equivalence_bound, worst_norm_difference)
      << std::flush;
  return ok ? 0 : 1;
}

/// How far ZeRO-3 under bf16 may drift from Replicated under bf16 autocast (fp32 parameters). ZeRO-3 computes
/// its blocks as FSDP2's param_dtype=bf16 does: weights, inputs and the residual adds inside a block in bf16
/// (2^-8 = 3.9e-3 relative per rounding), where autocast rounds only the matrix products' operands and keeps
/// the LayerNorms and the residual stream in fp32. So each step's gradients differ by a few roundings: their
/// norm, an average over every element, within 1e-2 (measured ~7e-4 on an AMD EPYC); a parameter trained from
/// zero (the biases), relative to its own small magnitude after 10 steps, within 1e-1 (measured ~2e-2). A
/// gradient lost between micro-batches moves the norm by a third; a shard cast once and not after the step
/// feeds every block stale weights.
constexpr double bf16_norm_bound = 1e-2, bf16_parameter_bound = 1e-1;

int check_gpt2_bf16(const std::shared_ptr<dist::ProcessGroup>& group, int steps, int accumulation,
                    hpctrain::models::Recompute recompute, bool tied) {
  const int rank = group->rank();
  auto [model, reference] = equal_gpt2s(tied);
  model->set_activation_checkpointing(recompute);
  hpctrain::FullyShardedStrategy strategy(small_buckets());
  strategy.setup({group, model.ptr(), make_sgd, hpctrain::Precision::bf16});
  const double worst_norm_difference =
      train_gpt2_beside_replicated(group, strategy, model, reference, steps, accumulation, hpctrain::Precision::bf16);
  bool ok = worst_norm_difference <= bf16_norm_bound;
  // The blocks were gathered in bf16: the two buckets held at once (one computing, one prefetched) took 2 bytes
  // an element.
  std::size_t expected_peak = 0;
  const auto& buckets = strategy.layout().buckets();
  for (std::size_t b = 0; b + 1 < strategy.block_count(); ++b)
    expected_peak =
        std::max(expected_peak, 2 * static_cast<std::size_t>(buckets[b].padded_numel + buckets[b + 1].padded_numel));
  const auto peak_in_training = strategy.peak_gathered_bytes();  // before the export's fp32 gather of every block
  // At most two reduce-scatters in flight, each holding its unit's fp32 gradient: at most the two largest units'.
  std::vector<std::size_t> unit_bytes;
  for (const auto& bucket : buckets) unit_bytes.push_back(4 * static_cast<std::size_t>(bucket.padded_numel));
  std::sort(unit_bytes.rbegin(), unit_bytes.rend());
  const auto reduce_scatter_bound = unit_bytes.at(0) + unit_bytes.at(1);
  const auto traffic = block_traffic_lines(strategy, steps, accumulation);
  const auto held = held_after_forward(group, strategy, model, hpctrain::Precision::bf16);
  strategy.gather_full_model();
  for (const auto& item : model->named_parameters())
    if (item.value().scalar_type() != torch::kFloat32) {
      std::cerr << fmt::format("rank {}: {} is gathered as {}, not fp32\n", rank, item.key(),
                               c10::toString(item.value().scalar_type()));
      ok = false;
    }
  const double worst = worst_relative_difference(model, reference, bf16_parameter_bound, rank, ok);
  std::cout
      << fmt::format(
             "max_relative_difference={:.3e}\nrelative_difference_bound={:.0e}\nmax_grad_norm_difference={:.3e}\n"
             "grad_norm_difference_bound={:.0e}\npeak_gathered_bytes={}\nbf16_peak_gathered_bytes={}\nmaster_bytes={}\n"
             "peak_reduce_scatter_bytes={}\nreduce_scatter_bytes_bound={}\n{}",
             worst, bf16_parameter_bound, worst_norm_difference, bf16_norm_bound, peak_in_training, expected_peak,
             strategy.master_bytes(), strategy.peak_reduce_scatter_bytes(), reduce_scatter_bound, traffic + held)
      << std::flush;
  return ok ? 0 : 1;
}

/// ZeRO-3 on a module that does not list blocks: refused at setup, naming the module.
int refuse_without_blocks(const std::shared_ptr<dist::ProcessGroup>& group) {
  auto model = torch::nn::Sequential(torch::nn::Linear(features, 8), torch::nn::Linear(8, classes));
  auto strategy = hpctrain::make_zero_strategy(hpctrain::zero3);
  strategy->setup({group, model.ptr(), make_adamw});
  std::cout << "accepted a model without blocks\n";
  return 0;
}

int refuse_lbfgs(const std::shared_ptr<dist::ProcessGroup>& group, hpctrain::ZeroStage stage) {
  auto model = make_model();
  auto strategy = hpctrain::make_zero_strategy(stage);
  strategy->setup({group, model.ptr(), [](const NamedParameters& named) -> std::unique_ptr<torch::optim::Optimizer> {
                     std::vector<torch::Tensor> tensors;
                     for (const auto& item : named) tensors.push_back(item.second);
                     return std::make_unique<torch::optim::LBFGS>(tensors);
                   }});
  std::cout << "accepted LBFGS\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  torch::set_num_threads(1);  // several ranks on two cores
  const std::string mode = argc > 1 ? argv[1] : "";
  auto group = dist::init_process_group(hpctrain::slurm::world_from_environment(), options_from_environment());
  // Every rank connected before any goes on: a mode that refuses at setup exits at once, and rank 0's exit takes
  // the rendezvous store with it, which a rank still connecting needs (it then failed with exit 1, not the refusal).
  dist::barrier(*group);
  if (mode == "equivalence" && (argc == 5 || argc == 6))
    return check_equivalence(group, stage_of(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]),
                             argc == 6 ? argv[5] : "adamw");
  if (mode == "train" && (argc == 6 || argc == 8 || argc == 9))
    return train(group, stage_of(argv[2]), argv[3], std::stoi(argv[4]), std::stoi(argv[5]),
                 argc >= 8 ? std::stoi(argv[6]) : 0, argc >= 8 ? std::stoi(argv[7]) : 0, 33, argc == 9 ? argv[8] : "");
  const auto flag = [&](int from, const char* name) {
    for (int k = from; k < argc; ++k)
      if (std::string(argv[k]) == name) return true;
    return false;
  };
  // "recompute": every block recomputed whole; "selective": its matrix products kept; neither: activations kept.
  const auto recompute_of = [&](int from) {
    using hpctrain::models::Recompute;
    return flag(from, "recompute") ? Recompute::full : flag(from, "selective") ? Recompute::selective : Recompute::none;
  };
  if (mode == "gpt2-equivalence" && argc >= 6 && argc <= 8)
    return check_gpt2_equivalence(group, stage_of(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), argv[5],
                                  recompute_of(6), !flag(6, "untied"));
  if (mode == "gpt2-bf16" && argc >= 4 && argc <= 6)
    return check_gpt2_bf16(group, std::stoi(argv[2]), std::stoi(argv[3]), recompute_of(4), !flag(4, "untied"));
  if (mode == "no-blocks" && argc == 2) return refuse_without_blocks(group);
  if (mode == "lbfgs" && argc == 3) return refuse_lbfgs(group, stage_of(argv[2]));
  if (mode == "format1" && (argc == 3 || argc == 4)) {  // each rank rewrites its own file
    rewrite_as_format1(argv[2], group->rank(), argc == 4 && group->rank() == 1 ? argv[3] : "");  // rank 1's defect
    return 0;
  }
  if (mode == "other-model" && argc == 5)  // a wider hidden layer than the checkpoint's model
    return train(group, stage_of(argv[2]), argv[3], -1, 12, std::stoi(argv[4]), 5, 34);
  std::cerr
      << "usage: zero_worker equivalence <stage> <steps> <accumulation> | train <stage> <dir> <save_at> <steps> "
         "[<resume_world> <resume_step> [<saved_strategy>]] | gpt2-equivalence <stage> <steps> <accumulation> "
         "<dir> [recompute|selective] [untied] | "
         "gpt2-bf16 <steps> <accumulation> [recompute|selective] [untied] | "
         "no-blocks | lbfgs <stage> | other-model <stage> <dir> <world> | format1 <dir> [missing-piece|short-piece]\n";
  return 2;
} catch (const hpctrain::SpecError& e) {
  std::cerr << e.what() << "\n";
  return hpctrain::exit_usage;
} catch (const hpctrain::Error& e) {
  std::cerr << e.what() << "\n";
  return hpctrain::exit_failure;
}
