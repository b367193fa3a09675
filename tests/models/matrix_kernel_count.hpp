#pragma once
// Counts ATen's matrix-product kernels (mm, addmm, bmm, baddbmm) while alive, through a global RecordFunction
// callback. The composite ops that reach them (linear, matmul) are not counted: each lands in one kernel call.
#include <atomic>
#include <cstring>
#include <memory>

#include <ATen/record_function.h>

namespace models_test {

class MatrixKernelCount {
 public:
  MatrixKernelCount() {
    count() = 0;
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start).scopes({at::RecordScope::FUNCTION}));
  }
  ~MatrixKernelCount() { at::removeCallback(handle_); }
  MatrixKernelCount(const MatrixKernelCount&) = delete;
  MatrixKernelCount& operator=(const MatrixKernelCount&) = delete;
  long value() const { return count(); }

 private:
  static std::atomic<long>& count() {
    static std::atomic<long> n{0};
    return n;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& function) {
    const char* name = function.name();
    for (const char* kernel : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
      if (std::strcmp(name, kernel) == 0) ++count();
    return nullptr;
  }
  at::CallbackHandle handle_;
};

}  // namespace models_test
