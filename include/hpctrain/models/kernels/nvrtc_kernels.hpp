#pragma once
// Hand-written CUDA kernels compiled at run time (NVRTC) and launched through the driver API on the current stream:
// kernels that read and write rows themselves (SwiGLU over the fused gate/up product's halves, rotary embeddings over
// q's and k's heads). ATen's jiterator, which ran them before, launches a TensorIterator that pays an offset
// calculation per operand and element and loses its vectorised path on any view or broadcast: on an H200 its
// rotary kernels moved 12% of a copy's bandwidth and its SwiGLU backward 23%; these move 40% and 100%
// (docs/gpu.md, 2026-11-27).
//
// Nothing is linked: NVRTC and the driver are looked up in the running process, through the library LibTorch loads
// for its own runtime compilation (libcaffe2_nvrtc.so beside libtorch_cuda.so, which depends on both), or a libnvrtc
// already loaded. A program built against a LibTorch without CUDA, or run where either is missing, gets no kernels
// and its users keep their composite paths; each user probes its kernels once (models/kernels/runtime_kernels.hpp). A
// source is compiled once per device and element type (bf16 or fp16) for the device's architecture; a kernel that
// fails to compile or launch raises a std::runtime_error naming NVRTC's log or the driver's reason.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <hpctrain/models/kernels/runtime_kernels.hpp>

#if __has_include(<cuda.h>) && __has_include(<nvrtc.h>) && __has_include(<c10/cuda/CUDAStream.h>) && \
    __has_include(<dlfcn.h>) && __has_include(<link.h>)
#define HPCTRAIN_NVRTC_KERNELS 1
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <nvrtc.h>
#else
#define HPCTRAIN_NVRTC_KERNELS 0
#endif

namespace hpctrain::models::detail {

/// What every row kernel's source starts with: `elem` (the 16-bit storage of bf16 or fp16, chosen by
/// HPCTRAIN_FP16), its conversions to and from fp32 (rounded to nearest even), and `Pack<V>`, V elements loaded
/// and stored as one access. No header: NVRTC compiles it as it is.
inline const std::string row_kernel_preamble = R"(
typedef unsigned short elem;
#if HPCTRAIN_FP16
__device__ __forceinline__ float to_float(elem h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ elem from_float(float f) { elem h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
__device__ __forceinline__ float to_float(elem h) { return __uint_as_float(static_cast<unsigned int>(h) << 16); }
__device__ __forceinline__ elem from_float(float f) { elem h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif
template <int V> struct __align__(2 * V) Pack { elem v[V]; };
)";

#if HPCTRAIN_NVRTC_KERNELS

/// NVRTC's and the driver's entry points, looked up in the process.
struct NvrtcApi {
  decltype(&::nvrtcCreateProgram) create_program = nullptr;
  decltype(&::nvrtcCompileProgram) compile_program = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) log = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy_program = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
  bool compiler() const {
    return create_program && compile_program && log_size && log && cubin_size && cubin && destroy_program &&
           error_string;
  }
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                            void**, void**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  bool driver() const {
    return ctx_get_current && ctx_set_current && primary_ctx_retain && device_get && device_get_attribute &&
           module_load_data && module_get_function && launch_kernel && get_error_string;
  }
};

/// The path of the first loaded object whose file name contains `part`, or "".
inline std::string loaded_library_path(const char* part) {
  std::pair<const char*, std::string> search{part, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* state = static_cast<std::pair<const char*, std::string>*>(data);
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        if (name.find(state->first) == std::string::npos) return 0;
        state->second = name;
        return 1;
      },
      &search);
  return search.second;
}

/// The handles the entry points are looked up in: LibTorch's libcaffe2_nvrtc.so (its dependencies are NVRTC and
/// the driver; dlsym searches them), then a libnvrtc and a libcuda already in the process.
inline std::vector<void*> nvrtc_handles() {
  std::vector<void*> handles;
  const auto torch_cuda = loaded_library_path("libtorch_cuda.so");
  if (!torch_cuda.empty()) {
    const auto directory = torch_cuda.substr(0, torch_cuda.rfind('/') + 1);
    if (void* handle = dlopen((directory + "libcaffe2_nvrtc.so").c_str(), RTLD_NOW | RTLD_LOCAL)) {
      handles.push_back(handle);
    }
  }
  for (const char* part : {"libnvrtc.so", "libcuda.so"}) {
    const auto path = loaded_library_path(part);
    if (path.empty()) continue;
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) handles.push_back(handle);
  }
  return handles;
}

/// The entry points found now (a search per call: the tests load NVRTC themselves; users keep nvrtc_api()'s).
inline NvrtcApi find_nvrtc_api() {
  NvrtcApi api;
  const auto handles = nvrtc_handles();
  const auto find = [&](auto& entry, const char* name) {
    for (void* handle : handles) {
      if (void* symbol = dlsym(handle, name)) {
        entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(symbol);
        return;
      }
    }
  };
  find(api.create_program, "nvrtcCreateProgram");
  find(api.compile_program, "nvrtcCompileProgram");
  find(api.log_size, "nvrtcGetProgramLogSize");
  find(api.log, "nvrtcGetProgramLog");
  find(api.cubin_size, "nvrtcGetCUBINSize");
  find(api.cubin, "nvrtcGetCUBIN");
  find(api.destroy_program, "nvrtcDestroyProgram");
  find(api.error_string, "nvrtcGetErrorString");
  find(api.ctx_get_current, "cuCtxGetCurrent");
  find(api.ctx_set_current, "cuCtxSetCurrent");
  find(api.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  find(api.device_get, "cuDeviceGet");
  find(api.device_get_attribute, "cuDeviceGetAttribute");
  find(api.module_load_data, "cuModuleLoadData");
  find(api.module_get_function, "cuModuleGetFunction");
  find(api.launch_kernel, "cuLaunchKernel");
  find(api.get_error_string, "cuGetErrorString");
  return api;
}

/// The process's entry points, found on the first call from a CUDA device (LibTorch has loaded its CUDA
/// libraries by then).
inline const NvrtcApi& nvrtc_api() {
  static const NvrtcApi api = find_nvrtc_api();
  return api;
}

/// `source` compiled by `api` for compute capability major.minor with `defines` (-D options): the CUBIN's bytes.
/// Throws std::runtime_error with NVRTC's log when it does not compile.
inline std::string nvrtc_compile(const NvrtcApi& api, const std::string& source, const std::string& name, int major,
                                 int minor, const std::vector<std::string>& defines) {
  if (!api.compiler()) throw std::runtime_error("NVRTC is not loaded in this process");
  nvrtcProgram program = nullptr;
  auto status = api.create_program(&program, source.c_str(), name.c_str(), 0, nullptr, nullptr);
  if (status != NVRTC_SUCCESS) throw std::runtime_error(std::string("nvrtcCreateProgram: ") + api.error_string(status));
  std::vector<std::string> options{"--gpu-architecture=sm_" + std::to_string(major * 10 + minor), "--std=c++17",
                                   "-default-device"};
  for (const auto& define : defines) options.push_back("-D" + define);
  std::vector<const char*> option_pointers;
  for (const auto& option : options) option_pointers.push_back(option.c_str());
  status = api.compile_program(program, static_cast<int>(option_pointers.size()), option_pointers.data());
  std::string cubin;
  if (status == NVRTC_SUCCESS) {
    std::size_t size = 0;
    api.cubin_size(program, &size);
    cubin.resize(size);
    api.cubin(program, cubin.data());
  }
  std::size_t log_size = 0;
  api.log_size(program, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 0) api.log(program, log.data());
  api.destroy_program(&program);
  if (status != NVRTC_SUCCESS) {
    throw std::runtime_error(std::string("NVRTC could not compile ") + name + " for sm_" +
                             std::to_string(major * 10 + minor) + ": " + api.error_string(status) + "\n" + log);
  }
  return cubin;
}

/// Throws a std::runtime_error naming `what` and the driver's reason unless `result` is CUDA_SUCCESS.
inline void check_driver(const NvrtcApi& api, CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* reason = nullptr;
  api.get_error_string(result, &reason);
  throw std::runtime_error(std::string(what) + ": " + (reason ? reason : "unknown CUDA error"));
}

/// One kernel source's functions on one device, for one element type: compiled and loaded on first use and kept for
/// the process (a module unloaded at exit would outlive its context).
class RowKernels {
 public:
  RowKernels(std::string name, std::string source) : name_(std::move(name)), source_(std::move(source)) {}

  /// Launches `kernel` with `grid` and `block` (x, y, z) and `arguments` on `device`'s current stream, for elements
  /// of `dtype` (bf16 or fp16).
  void launch(const torch::Device& device, c10::ScalarType dtype, const std::string& kernel,
              std::tuple<unsigned, unsigned, unsigned> grid, std::tuple<unsigned, unsigned, unsigned> block,
              std::vector<void*> arguments) {
    const c10::cuda::CUDAGuard guard(device);
    const auto& api = nvrtc_api();
    const CUfunction function = find(api, device, dtype, kernel);
    const auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    check_driver(
        api,
        api.launch_kernel(function, std::get<0>(grid), std::get<1>(grid), std::get<2>(grid), std::get<0>(block),
                          std::get<1>(block), std::get<2>(block), 0, stream, arguments.data(), nullptr),
        ("cuLaunchKernel " + kernel).c_str());
  }

 private:
  CUfunction find(const NvrtcApi& api, const torch::Device& device, c10::ScalarType dtype, const std::string& kernel) {
    if (!api.compiler() || !api.driver()) throw std::runtime_error("NVRTC or the CUDA driver is not in this process");
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_tuple(static_cast<int>(device.index()), static_cast<int>(dtype), kernel);
    if (const auto found = functions_.find(key); found != functions_.end()) return found->second;
    const auto module_key = std::make_pair(static_cast<int>(device.index()), static_cast<int>(dtype));
    auto module = modules_.find(module_key);
    if (module == modules_.end()) module = modules_.emplace(module_key, load(api, device, dtype)).first;
    CUfunction function = nullptr;
    check_driver(api, api.module_get_function(&function, module->second, kernel.c_str()),
                 ("cuModuleGetFunction " + kernel).c_str());
    functions_.emplace(key, function);
    return function;
  }

  CUmodule load(const NvrtcApi& api, const torch::Device& device, c10::ScalarType dtype) const {
    CUcontext context = nullptr;
    check_driver(api, api.ctx_get_current(&context), "cuCtxGetCurrent");
    CUdevice handle = 0;
    check_driver(api, api.device_get(&handle, device.index()), "cuDeviceGet");
    if (context == nullptr) {  // as ATen's runtime compilation does: the runtime's primary context, made current
      check_driver(api, api.primary_ctx_retain(&context, handle), "cuDevicePrimaryCtxRetain");
      check_driver(api, api.ctx_set_current(context), "cuCtxSetCurrent");
    }
    int major = 0, minor = 0;
    check_driver(api, api.device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle),
                 "cuDeviceGetAttribute");
    check_driver(api, api.device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle),
                 "cuDeviceGetAttribute");
    const auto cubin = nvrtc_compile(api, row_kernel_preamble + source_, name_, major, minor,
                                     {std::string("HPCTRAIN_FP16=") + (dtype == torch::kHalf ? "1" : "0")});
    CUmodule module = nullptr;
    check_driver(api, api.module_load_data(&module, cubin.data()), ("cuModuleLoadData " + name_).c_str());
    return module;
  }

  std::string name_, source_;
  std::mutex mutex_;
  std::map<std::pair<int, int>, CUmodule> modules_;
  std::map<std::tuple<int, int, std::string>, CUfunction> functions_;
};

#endif  // HPCTRAIN_NVRTC_KERNELS

/// Whether row kernels may run on `device` for elements of `dtype`: built with CUDA's headers, a CUDA device, the
/// runtime-kernel switch on (models/kernels/runtime_kernels.hpp), bf16 or fp16, NVRTC and the driver found.
inline bool row_kernels_possible(const torch::Device& device, c10::ScalarType dtype) {
#if HPCTRAIN_NVRTC_KERNELS
  if (!device.is_cuda() || !runtime_kernels() || (dtype != torch::kBFloat16 && dtype != torch::kHalf)) return false;
  const auto& api = nvrtc_api();
  return api.compiler() && api.driver();
#else
  (void)device, (void)dtype;
  return false;
#endif
}

/// The stride between rows of `t` seen as [rows, last dimension] with unit stride along it, or -1 where it cannot
/// be (a last dimension that is not contiguous, leading dimensions that do not collapse into one).
inline std::int64_t row_stride(const torch::Tensor& t) {
  if (t.dim() == 0 || (t.size(-1) > 1 && t.stride(-1) != 1)) return -1;
  if (t.numel() == t.size(-1)) return t.size(-1);  // one row
  for (std::int64_t dim = t.dim() - 2; dim > 0; --dim) {
    if (t.size(dim) == 1 || t.stride(dim - 1) != t.stride(dim) * t.size(dim)) return -1;
  }
  return t.stride(-2);
}

}  // namespace hpctrain::models::detail
