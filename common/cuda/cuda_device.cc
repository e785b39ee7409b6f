#include "common/cuda/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef TALLY_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_kernels.h"
#include "common/kernels.h"

namespace tally::cuda {

namespace {

// CUDA and cuBLAS failures become a Status naming the call, never an abort
// (the way NCCL's CUDACHECK turns them into return values).
absl::Status CudaStatus(cudaError_t e, const char* call, int device) {
  if (e == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code = e == cudaErrorMemoryAllocation
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, " on cuda:", device, ": ",
                                         cudaGetErrorString(e)));
}

absl::Status CublasStatus(cublasStatus_t s, const char* call, int device) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      call, " on cuda:", device, ": cuBLAS status ", static_cast<int>(s)));
}

class CudaDevice;

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(CudaDevice* device) : device_(device) {}

  void Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c,
            int ldc) override;
  void Fill(float* x, int64_t n, float v) override {
    cuda::Fill(x, n, v, stream());
  }
  void Copy(const float* src, float* dst, int64_t n) override;
  void Axpy(int64_t n, float a, const float* x, float* y) override {
    cuda::Axpy(n, a, x, y, stream());
  }
  void Scale(int64_t n, float a, float* x) override {
    cuda::Scale(n, a, x, stream());
  }
  void BroadcastRows(const float* b, int rows, int cols, float* y) override {
    cuda::BroadcastRows(b, rows, cols, y, stream());
  }
  void SumRows(const float* dy, int rows, int cols, float* db) override {
    cuda::SumRows(dy, rows, cols, db, stream());
  }
  void ReluForward(const float* x, float* y, int64_t n) override {
    cuda::ReluForward(x, y, n, stream());
  }
  void ReluBackward(const float* y, const float* dy, float* dx,
                    int64_t n) override {
    cuda::ReluBackward(y, dy, dx, n, stream());
  }
  void DropoutForward(const float* x, float* y, float* mask, int64_t n, float p,
                      uint64_t seed, int64_t offset) override {
    cuda::DropoutForward(x, y, mask, n, p, seed, offset, stream());
  }
  void Multiply(const float* a, const float* b, float* out,
                int64_t n) override {
    cuda::Multiply(a, b, out, n, stream());
  }
  void Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                     const float* b, float* y) override;
  void Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                      const float* dy, float* dw, float* db,
                      float* dx) override;
  void MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                        int32_t* argmax) override {
    cuda::MaxPoolForward(g, x, y, argmax, stream());
  }
  void MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                         const int32_t* argmax, float* dx) override {
    cuda::MaxPoolBackward(g, dy, argmax, dx, stream());
  }
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                           int batch, int classes, float scale, float* dlogits,
                           float* stats) override;
  void SoftmaxCrossEntropyStats(const float* logits, const int32_t* labels,
                                int batch, int classes, float* stats) override;

 private:
  Stream stream() const;
  float* Scratch(
      size_t floats);  // grows, never shrinks: no per-step cudaMalloc

  CudaDevice* device_;  // owner
  float* scratch_ = nullptr;
  size_t scratch_size_ = 0;
  friend class CudaDevice;
};

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int index) {
    std::unique_ptr<CudaDevice> d(new CudaDevice(index));
    if (auto s = CudaStatus(cudaSetDevice(index), "cudaSetDevice", index);
        !s.ok())
      return s;
    if (auto s = CudaStatus(
            cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking),
            "cudaStreamCreate", index);
        !s.ok()) {
      return s;
    }
    if (auto s = CudaStatus(
            cudaStreamCreateWithFlags(&d->copy_stream_, cudaStreamNonBlocking),
            "cudaStreamCreate(copies)", index);
        !s.ok()) {
      return s;
    }
    for (cudaEvent_t* e : {&d->compute_done_, &d->copy_done_}) {
      if (auto s =
              CudaStatus(cudaEventCreateWithFlags(e, cudaEventDisableTiming),
                         "cudaEventCreate", index);
          !s.ok()) {
        return s;
      }
    }
    if (auto s = CublasStatus(cublasCreate(&d->cublas_), "cublasCreate", index);
        !s.ok()) {
      return s;
    }
    cublasSetStream(d->cublas_, d->stream_);
    cublasSetMathMode(d->cublas_, CUBLAS_DEFAULT_MATH);
    void* flag = nullptr;
    if (auto s =
            CudaStatus(cudaMalloc(&flag, sizeof(int)), "cudaMalloc", index);
        !s.ok()) {
      return s;
    }
    d->error_flag_ = static_cast<int*>(flag);
    cudaMemsetAsync(d->error_flag_, 0, sizeof(int), d->stream_);
    return d;
  }

  ~CudaDevice() override {
    cudaSetDevice(index_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    if (kernels_.scratch_ != nullptr) cudaFree(kernels_.scratch_);
    if (error_flag_ != nullptr) cudaFree(error_flag_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
    if (copy_done_ != nullptr) cudaEventDestroy(copy_done_);
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  DeviceId id() const override { return {DeviceType::kCuda, index_}; }
  Kernels& kernels() override {
    cudaSetDevice(index_);  // the calling thread drives this GPU
    return kernels_;
  }
  bool host_accessible() const override { return false; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    cudaSetDevice(index_);
    void* p = nullptr;
    if (auto s = CudaStatus(cudaMalloc(&p, bytes == 0 ? 4 : bytes),
                            "cudaMalloc", index_);
        !s.ok()) {
      return s;
    }
    return p;
  }
  void Free(void* ptr) override {
    cudaSetDevice(index_);
    cudaFree(ptr);
  }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    // Portable to every GPU under unified addressing; the current device only
    // decides which context registers it.
    cudaSetDevice(index_);
    void* p = nullptr;
    if (auto s = CudaStatus(cudaMallocHost(&p, bytes == 0 ? 4 : bytes),
                            "cudaMallocHost", index_);
        !s.ok()) {
      return s;
    }
    return p;
  }
  void FreeHost(void* ptr) override { cudaFreeHost(ptr); }

  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    cudaSetDevice(index_);
    Note(CudaStatus(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(host to device)", index_));
    // The caller may reuse `src` at once: wait for the copy.
    return Synchronize();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    cudaSetDevice(index_);
    Note(CudaStatus(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(device to host)", index_));
    return Synchronize();
  }
  // The copy stream runs beside the compute stream; events order the two
  // (an event waited on is captured at the wait, so one event per direction
  // serves every copy).
  absl::Status CopyFromHostAsync(void* dst, const void* src,
                                 size_t bytes) override {
    cudaSetDevice(index_);
    Note(CudaStatus(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream_),
        "cudaMemcpyAsync(host to device, async)", index_));
    Note(CudaStatus(cudaEventRecord(copy_done_, copy_stream_),
                    "cudaEventRecord", index_));
    Note(CudaStatus(cudaStreamWaitEvent(stream_, copy_done_, 0),
                    "cudaStreamWaitEvent", index_));
    return absl::OkStatus();
  }
  absl::Status CopyToHostAsync(void* dst, const void* src,
                               size_t bytes) override {
    cudaSetDevice(index_);
    Note(CudaStatus(cudaEventRecord(compute_done_, stream_), "cudaEventRecord",
                    index_));
    Note(CudaStatus(cudaStreamWaitEvent(copy_stream_, compute_done_, 0),
                    "cudaStreamWaitEvent", index_));
    Note(CudaStatus(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_),
        "cudaMemcpyAsync(device to host, async)", index_));
    return absl::OkStatus();
  }

  // One event per mark, recorded on the copy stream; reused after the next
  // Synchronize, when every one of them has completed.
  absl::StatusOr<int> MarkCopiesToHost() override {
    cudaSetDevice(index_);
    if (marks_used_ == marks_.size()) {
      cudaEvent_t e = nullptr;
      if (auto s = CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                              "cudaEventCreate", index_);
          !s.ok()) {
        return s;
      }
      marks_.push_back(e);
    }
    Note(CudaStatus(cudaEventRecord(marks_[marks_used_], copy_stream_),
                    "cudaEventRecord", index_));
    return static_cast<int>(++marks_used_);
  }
  absl::Status WaitCopiesToHost(int mark) override {
    if (mark <= 0 || static_cast<size_t>(mark) > marks_used_) {
      return absl::InvalidArgumentError(
          absl::StrCat("no copy mark ", mark, " on cuda:", index_));
    }
    cudaSetDevice(index_);
    Note(CudaStatus(cudaEventSynchronize(marks_[mark - 1]),
                    "cudaEventSynchronize", index_));
    // A kernel that failed to launch leaves the events complete.
    Note(CudaStatus(cudaGetLastError(), "kernel launch", index_));
    return error_;
  }

  absl::Status CopyFromPeer(void* dst, Device& peer, const void* src,
                            size_t bytes) override {
    auto* gpu = dynamic_cast<CudaDevice*>(&peer);
    if (gpu == nullptr) return Device::CopyFromPeer(dst, peer, src, bytes);
    cudaSetDevice(index_);
    EnablePeerAccess(gpu->index());
    // The peer's work on `src` is done (the caller's contract); ordering on
    // this stream puts the copy after our own earlier kernels.
    Note(CudaStatus(
        cudaMemcpyPeerAsync(dst, index_, src, gpu->index(), bytes, stream_),
        "cudaMemcpyPeerAsync", index_));
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    cudaSetDevice(index_);
    Note(CudaStatus(cudaStreamSynchronize(copy_stream_),
                    "cudaStreamSynchronize(copies)", index_));
    Note(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize",
                    index_));
    Note(CudaStatus(cudaGetLastError(), "kernel launch", index_));
    int flag = 0;
    if (error_.ok() &&
        cudaMemcpy(&flag, error_flag_, sizeof(int), cudaMemcpyDeviceToHost) ==
            cudaSuccess &&
        flag != 0) {
      cudaMemset(error_flag_, 0, sizeof(int));
      Note(absl::InvalidArgumentError(absl::StrCat(
          "a label is outside the class range (cuda:", index_, ")")));
    }
    absl::Status s = std::move(error_);
    error_ = absl::OkStatus();
    marks_used_ = 0;
    return s;
  }
  void SetAllowTf32(bool allow) override {
    cublasSetMathMode(cublas_,
                      allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
  }

  void Note(absl::Status s) {
    if (error_.ok() && !s.ok()) error_ = std::move(s);
  }

  Stream stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  int index() const { return index_; }
  int* error_flag() const { return error_flag_; }

 private:
  explicit CudaDevice(int index) : index_(index), kernels_(this) {}

  // Direct copies over NVLink/PCIe where the pair allows; otherwise
  // cudaMemcpyPeerAsync stages through host memory by itself.
  void EnablePeerAccess(int peer) {
    if (peer == index_) return;
    for (int p : peers_checked_)
      if (p == peer) return;
    peers_checked_.push_back(peer);
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, index_, peer) == cudaSuccess && can) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    }
  }

  int index_;
  cudaStream_t stream_ = nullptr;       // kernels, cuBLAS, synchronous copies
  cudaStream_t copy_stream_ = nullptr;  // the *Async copies
  cudaEvent_t compute_done_ = nullptr;  // compute -> copy ordering
  cudaEvent_t copy_done_ = nullptr;     // copy -> compute ordering
  std::vector<cudaEvent_t> marks_;      // MarkCopiesToHost's events
  size_t marks_used_ = 0;               // since the last Synchronize
  std::vector<int> peers_checked_;
  cublasHandle_t cublas_ = nullptr;
  int* error_flag_ = nullptr;
  absl::Status error_;  // first failure since the last Synchronize
  CudaKernels kernels_;
};

Stream CudaKernels::stream() const { return device_->stream(); }

float* CudaKernels::Scratch(size_t floats) {
  if (floats > scratch_size_) {
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_size_ = 0;
    void* p = nullptr;
    absl::Status s = CudaStatus(cudaMalloc(&p, floats * sizeof(float)),
                                "cudaMalloc(scratch)", device_->index());
    if (!s.ok()) {
      device_->Note(std::move(s));
      return nullptr;
    }
    scratch_ = static_cast<float*>(p);
    scratch_size_ = floats;
  }
  return scratch_;
}

void CudaKernels::Gemm(bool ta, bool tb, int m, int n, int k, float alpha,
                       const float* a, int lda, const float* b, int ldb,
                       float beta, float* c, int ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  device_->Note(CublasStatus(
      cublasSgemm(device_->cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a,
                  lda, &beta, c, ldc),
      "cublasSgemm", device_->index()));
}

void CudaKernels::Copy(const float* src, float* dst, int64_t n) {
  if (src == dst) return;
  device_->Note(CudaStatus(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream()),
                           "cudaMemcpyAsync(device to device)",
                           device_->index()));
}

void CudaKernels::Conv2dForward(const Conv2dGeometry& g, const float* x,
                                const float* w, const float* b, float* y) {
  const int ckk = g.in_channels * g.kernel * g.kernel;
  const int p = g.out_h() * g.out_w();
  float* col = Scratch(static_cast<size_t>(g.batch) * ckk * p);
  if (col == nullptr) return;
  cuda::Im2ColBatch(g, x, col, stream());
  // Per sample: y_n[Cout, P] = W[Cout, CKK] col_n[CKK, P]; column-major that
  // is y_n^T[P, Cout] = col_n^T[P, CKK] W^T[CKK, Cout].
  const float one = 1.0f, zero = 0.0f;
  device_->Note(CublasStatus(
      cublasSgemmStridedBatched(
          device_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, p, g.out_channels, ckk,
          &one, col, p, static_cast<long long>(ckk) * p, w, ckk, 0, &zero, y, p,
          static_cast<long long>(g.out_channels) * p, g.batch),
      "cublasSgemmStridedBatched(conv forward)", device_->index()));
  if (b != nullptr)
    cuda::AddChannelBias(b, g.batch, g.out_channels, p, y, stream());
}

void CudaKernels::Conv2dBackward(const Conv2dGeometry& g, const float* x,
                                 const float* w, const float* dy, float* dw,
                                 float* db, float* dx) {
  const int ckk = g.in_channels * g.kernel * g.kernel;
  const int p = g.out_h() * g.out_w();
  const size_t col_size = static_cast<size_t>(g.batch) * ckk * p;
  float* col = Scratch(col_size * (dx != nullptr ? 2 : 1));
  if (col == nullptr) return;
  cuda::Im2ColBatch(g, x, col, stream());
  // dW[Cout, CKK] = sum_n dy_n[Cout, P] col_n^T[P, CKK]; column-major:
  // dW^T[CKK, Cout] = col_n[CKK, P] dy_n^T[P, Cout], accumulated over n.
  const float one = 1.0f, zero = 0.0f;
  for (int n = 0; n < g.batch; ++n) {
    device_->Note(CublasStatus(
        cublasSgemm(device_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, ckk,
                    g.out_channels, p, &one,
                    col + static_cast<size_t>(n) * ckk * p, p,
                    dy + static_cast<size_t>(n) * g.out_channels * p, p,
                    n == 0 ? &zero : &one, dw, ckk),
        "cublasSgemm(conv weight gradient)", device_->index()));
  }
  if (g.batch == 0)
    cuda::Fill(dw, static_cast<int64_t>(g.out_channels) * ckk, 0.0f, stream());
  if (db != nullptr)
    cuda::ChannelSum(dy, g.batch, g.out_channels, p, db, stream());
  if (dx != nullptr) {
    float* dcol = col + col_size;
    // dcol_n[CKK, P] = W^T[CKK, Cout] dy_n[Cout, P]; column-major:
    // dcol_n^T[P, CKK] = dy_n^T[P, Cout] W[Cout, CKK].
    device_->Note(CublasStatus(
        cublasSgemmStridedBatched(
            device_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, p, ckk, g.out_channels,
            &one, dy, p, static_cast<long long>(g.out_channels) * p, w, ckk, 0,
            &zero, dcol, p, static_cast<long long>(ckk) * p, g.batch),
        "cublasSgemmStridedBatched(conv input gradient)", device_->index()));
    cuda::Col2ImBatch(g, dcol, dx, stream());
  }
}

void CudaKernels::SoftmaxCrossEntropy(const float* logits,
                                      const int32_t* labels, int batch,
                                      int classes, float scale, float* dlogits,
                                      float* stats) {
  cuda::SoftmaxCrossEntropy(logits, labels, batch, classes, scale, dlogits,
                            stats, device_->error_flag(), stream());
}

void CudaKernels::SoftmaxCrossEntropyStats(const float* logits,
                                           const int32_t* labels, int batch,
                                           int classes, float* stats) {
  cuda::SoftmaxCrossEntropy(logits, labels, batch, classes, 0.0f, nullptr,
                            stats, device_->error_flag(), stream());
}

#ifdef TALLY_HAVE_NCCL
// NCCL is loaded at run time (dlopen), not linked: a worker starts on a
// machine without libnccl, and several GPUs then reduce by peer copies.
// Only nccl.h's types are taken from the build.
class NcclLibrary {
 public:
  static absl::StatusOr<std::unique_ptr<NcclLibrary>> Open() {
    std::unique_ptr<NcclLibrary> lib(new NcclLibrary());
    lib->handle_ = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib->handle_ == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("cannot load NCCL: ", dlerror()));
    }
    if (!lib->Bind(&lib->comm_init_all, "ncclCommInitAll") ||
        !lib->Bind(&lib->all_reduce, "ncclAllReduce") ||
        !lib->Bind(&lib->comm_destroy, "ncclCommDestroy") ||
        !lib->Bind(&lib->error_string, "ncclGetErrorString")) {
      return absl::UnimplementedError(
          absl::StrCat("libnccl.so.2 lacks a symbol: ", dlerror()));
    }
    return lib;
  }
  ~NcclLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

 private:
  NcclLibrary() = default;
  template <typename F>
  bool Bind(F* f, const char* name) {
    *f = reinterpret_cast<F>(dlsym(handle_, name));
    return *f != nullptr;
  }
  void* handle_ = nullptr;
};

class NcclCollective final : public Collective {
 public:
  NcclCollective(std::unique_ptr<NcclLibrary> nccl,
                 std::vector<CudaDevice*> devices)
      : nccl_(std::move(nccl)), devices_(std::move(devices)) {}
  const char* name() const override { return "nccl"; }
  ~NcclCollective() override {
    for (ncclComm_t c : comms_) nccl_->comm_destroy(c);
  }
  absl::Status Init() {
    std::vector<int> ids;
    for (CudaDevice* d : devices_) ids.push_back(d->index());
    comms_.resize(ids.size());
    ncclResult_t r = nccl_->comm_init_all(
        comms_.data(), static_cast<int>(ids.size()), ids.data());
    if (r != ncclSuccess) {
      comms_.clear();
      return absl::InternalError(
          absl::StrCat("ncclCommInitAll: ", nccl_->error_string(r)));
    }
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(int rank, float* buffer, int64_t count) override {
    CudaDevice* d = devices_[rank];
    cudaSetDevice(d->index());
    ncclResult_t r =
        nccl_->all_reduce(buffer, buffer, static_cast<size_t>(count), ncclFloat,
                          ncclSum, comms_[rank], d->stream());
    if (r != ncclSuccess) {
      return absl::InternalError(absl::StrCat(
          "ncclAllReduce on cuda:", d->index(), ": ", nccl_->error_string(r)));
    }
    return d->Synchronize();
  }

 private:
  std::unique_ptr<NcclLibrary> nccl_;  // outlives comms_
  std::vector<CudaDevice*> devices_;   // borrowed
  std::vector<ncclComm_t> comms_;
};
#endif

}  // namespace

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorString(e)));
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Device>> OpenDevice(int index) {
  auto count = DeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open cuda:", index, ": ", count.status().message()));
  }
  if (index < 0 || index >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat("there is no GPU cuda:", index,
                     " (cudaGetDeviceCount reported ", *count, ")"));
  }
  auto d = CudaDevice::Create(index);
  if (!d.ok()) return d.status();
  return std::unique_ptr<Device>(std::move(*d));
}

absl::Status LoadNccl() {
#ifdef TALLY_HAVE_NCCL
  return NcclLibrary::Open().status();
#else
  return absl::UnimplementedError("this build has no NCCL (nccl.h not found)");
#endif
}

absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(
    const std::vector<Device*>& devices) {
#ifdef TALLY_HAVE_NCCL
  std::vector<CudaDevice*> cuda;
  for (Device* d : devices) {
    auto* c = dynamic_cast<CudaDevice*>(d);
    if (c == nullptr)
      return absl::InvalidArgumentError("NCCL needs CUDA devices");
    cuda.push_back(c);
  }
  auto nccl = NcclLibrary::Open();
  if (!nccl.ok()) return nccl.status();
  auto group =
      std::make_unique<NcclCollective>(*std::move(nccl), std::move(cuda));
  if (absl::Status s = group->Init(); !s.ok()) return s;
  return std::unique_ptr<Collective>(std::move(group));
#else
  (void)devices;
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

}  // namespace tally::cuda
