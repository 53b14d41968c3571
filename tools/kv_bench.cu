// fluxon_kv_bench: KV page copies through plan blobs on the GPU, against baselines measured in the
// same run: contiguous cudaMemcpyAsync of the same bytes (the link's limit) and a per-page
// cudaMemcpyAsync loop (the naive path). The Fluxon paths: SM kernel, copy engines and the few-SM
// bulk-copy (TMA) kernel.
#ifdef FLUXON_HAVE_CUBLAS
#include <cublas_v2.h>
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "fluxon/kv/kv_cuda.hpp"

using namespace fluxon::kv;

#ifdef FLUXON_HAVE_CUBLAS
#define CB(x)                                                                                 \
  do {                                                                                        \
    cublasStatus_t e_ = (x);                                                                  \
    if (e_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, int(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#endif
// Every Fluxon copy's Status is checked: a failed copy must never report a fast time.
#define OK(x)                                                                                               \
  do {                                                                                                      \
    const fluxon::Status st_ = (x);                                                                         \
    if (!st_.is_ok()) {                                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, std::string(st_.message()).c_str()); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

constexpr uint64_t kMagic = 0x4658504C414E5631ull;

__global__ void busy_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Setup {
  KvLayout L;
  size_t n;
  void* gpu = nullptr;          // one "layer" buffer holding 2n pages (MLA, 1 layer: chunk = value)
  std::vector<void*> layers;    // for multi-layer layouts
  std::vector<uint64_t> kp, vp;
  uint8_t* host = nullptr;      // registered values
  size_t value_stride = 0;
  std::vector<uint64_t> blob;
  std::vector<int64_t> pages;

  Setup(KvLayout l, size_t n_, uint8_t* host_values, size_t host_bytes) : L(l), n(n_), host(host_values) {
    const size_t gpu_pages = n * 2;
    for (uint32_t layer = 0; layer < L.layer_num; ++layer)
      for (uint32_t kv = 0; kv < L.kv_count(); ++kv) {
        void* d = nullptr;
        CK(cudaMalloc(&d, gpu_pages * L.chunk_bytes()));
        CK(cudaMemset(d, 1, gpu_pages * L.chunk_bytes()));
        layers.push_back(d);
        (kv == 0 ? kp : vp).push_back(reinterpret_cast<uint64_t>(d));
      }
    value_stride = (L.value_bytes() + 4095) / 4096 * 4096;
    if (value_stride * n > host_bytes) {
      std::fprintf(stderr, "host buffer too small\n");
      std::exit(1);
    }
    std::mt19937_64 rng(n);
    std::vector<int64_t> all(gpu_pages);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    pages.assign(all.begin(), all.begin() + n);  // scattered GPU pages
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);  // scattered values
    blob = {kMagic, n};
    for (size_t i = 0; i < n; ++i) blob.push_back(reinterpret_cast<uint64_t>(host + order[i] * value_stride));
  }
  ~Setup() {
    for (auto* d : layers) cudaFree(d);
  }
  PageCopy copy() {
    PageCopy c;
    c.plan_ptr = reinterpret_cast<uint64_t>(blob.data());
    c.layout = L;
    c.k_ptrs = kp.data();
    c.v_ptrs = vp.empty() ? kp.data() : vp.data();
    c.page_indices = pages.data();
    c.page_count = n;
    return c;
  }
  uint64_t bytes() const { return uint64_t(n) * L.value_bytes(); }
};

// Times `fn` (which enqueues on s) with events; returns ms; reps, median.
template <class F>
double time_ms(cudaStream_t s, F&& fn, int reps = 5) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn();  // warm-up
  CK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, s));
    fn();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

}  // namespace

int main() {
  std::string why;
  if (!cuda_device_available(&why)) {
    std::printf("no GPU: %s\n", why.c_str());
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const size_t total = 1ull << 30;
  const size_t host_bytes = total + (64ull << 20);
  auto* host = static_cast<uint8_t*>(std::aligned_alloc(4096, host_bytes));
  std::memset(host, 2, host_bytes);
  if (!cuda_register_host(host, host_bytes).is_ok()) return 1;
  void* dcont = nullptr;
  CK(cudaMalloc(&dcont, total));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GpuCopier g;

  std::printf("\n1 GiB in scattered pages (scattered GPU pages and values), GB/s, median of 5\n");
  std::printf("(few-SM: %u CTAs)\n", g.few_sm_ctas());
  std::printf("%-9s %-8s %9s %9s %7s %9s %7s %9s %7s %9s %9s %12s %12s\n", "page", "dir", "contig", "SM-kern", "x",
              "copy-eng", "x", "few-SM", "x", "per-page", "SM/naive", "cpu us/pg SM", "cpu us/pg CE");
  for (uint64_t page : {16ull << 10, 64ull << 10, 256ull << 10, 1ull << 20, 4718592ull}) {
    const size_t n = total / page;
    Setup st(KvLayout{ValueLayout::kMla, 1, 16, page / 16}, n, host, host_bytes);
    for (auto dir : {Direction::kRestore, Direction::kBackup}) {
      const bool restore = dir == Direction::kRestore;
      const double gb = double(st.bytes()) / 1e9;
      const double contig = gb / (time_ms(s, [&] {
        CK(cudaMemcpyAsync(restore ? dcont : static_cast<void*>(host), restore ? static_cast<void*>(host) : dcont,
                           st.bytes(), restore ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
      }) / 1e3);
      double cpu_sm = 0, cpu_ce = 0, cpu_fs = 0;
      auto run = [&](CopyPath p, double* cpu) {
        auto t0 = std::chrono::steady_clock::now();
        OK(g.copy(dir, st.copy(), s, p));
        *cpu = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
      };
      const double sm = gb / (time_ms(s, [&] { run(CopyPath::kSmKernel, &cpu_sm); }) / 1e3);
      const double ce = gb / (time_ms(s, [&] { run(CopyPath::kCopyEngine, &cpu_ce); }) / 1e3);
      const double fs = gb / (time_ms(s, [&] { run(CopyPath::kFewSm, &cpu_fs); }) / 1e3);
      const double naive = gb / (time_ms(s, [&] {
        auto* vp = st.blob.data() + 2;
        for (size_t i = 0; i < n; ++i) {
          void* gpu = static_cast<uint8_t*>(st.layers[0]) + st.pages[i] * page;
          void* val = reinterpret_cast<void*>(vp[i]);
          CK(cudaMemcpyAsync(restore ? gpu : val, restore ? val : gpu, page, cudaMemcpyDefault, s));
        }
      }, 3) / 1e3);
      std::printf("%-9llu %-8s %9.1f %9.1f %7.2f %9.1f %7.2f %9.1f %7.2f %9.1f %9.2f %12.3f %12.3f\n",
                  (unsigned long long)page, restore ? "restore" : "backup", contig, sm, sm / contig, ce, ce / contig,
                  fs, fs / contig, naive, sm / naive, cpu_sm, cpu_ce);
    }
  }

  // Small restores of real-shaped pages: 36 layers x K,V x 64 tokens x 512 B = 4.5 MiB values.
  std::printf("\nsmall restores, page_first 36 layers x 64 tokens x 512 B (4.5 MiB values), median of 21\n");
  {
    const double link = [&] {
      return (64.0 * 4718592 / 1e9) / (time_ms(s, [&] {
        CK(cudaMemcpyAsync(dcont, host, 64ull * 4718592, cudaMemcpyHostToDevice, s));
      }) / 1e3);
    }();
    std::printf("%-6s %12s %12s %12s %14s %10s\n", "pages", "SM us", "CE us", "few-SM us", "bound us", "SM/bound");
    for (size_t n : {1, 8, 32}) {
      Setup st(KvLayout{ValueLayout::kPageFirst, 36, 64, 512}, n, host, host_bytes);
      const double sm = 1e3 * time_ms(s, [&] { OK(g.copy(Direction::kRestore, st.copy(), s, CopyPath::kSmKernel)); }, 21);
      const double ce = 1e3 * time_ms(s, [&] { OK(g.copy(Direction::kRestore, st.copy(), s, CopyPath::kCopyEngine)); }, 21);
      const double fs = 1e3 * time_ms(s, [&] { OK(g.copy(Direction::kRestore, st.copy(), s, CopyPath::kFewSm)); }, 21);
      const double bound = 1.15 * (double(st.bytes()) / 1e9) / link * 1e6 + 15;
      std::printf("%-6zu %12.1f %12.1f %12.1f %14.1f %10.2f\n", n, sm, ce, fs, bound, sm / bound);
    }
    std::printf("(link bandwidth for the bound: contiguous H2D %.1f GB/s)\n", link);
  }

  // Interference: a restore beside a kernel that fills every SM.
  std::printf("\nrestore of 256 MiB in 64 KiB pages beside a kernel that occupies every SM\n");
  {
    const size_t n = (256ull << 20) / (64 << 10);
    Setup st(KvLayout{ValueLayout::kMla, 1, 16, 4096}, n, host, host_bytes);
    cudaStream_t busy;
    CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    const long long cycles = (long long)khz * 40;  // ~40 ms at that clock
    for (auto p : {CopyPath::kSmKernel, CopyPath::kCopyEngine, CopyPath::kFewSm}) {
      const double alone = time_ms(s, [&] { OK(g.copy(Direction::kRestore, st.copy(), s, p)); });
      std::vector<double> t;
      for (int r = 0; r < 3; ++r) {
        busy_kernel<<<prop.multiProcessorCount * 4, 1024, 0, busy>>>(cycles);
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        cudaEventRecord(a, s);
        OK(g.copy(Direction::kRestore, st.copy(), s, p));
        cudaEventRecord(b, s);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms);
        CK(cudaStreamSynchronize(busy));
      }
      std::printf("  %-12s alone %7.2f ms, beside the busy kernel %7.2f ms: %.2fx\n",
                  p == CopyPath::kSmKernel ? "SM kernel" : p == CopyPath::kCopyEngine ? "copy engine" : "few-SM",
                  alone, median(t), median(t) / alone);
    }
  }

  // Beside the model's own work: a saturating bf16 GEMM (cuBLAS, 8192^3) on another stream. Each
  // copy path restores (then backs up) 256 MiB of scattered pages over and over while a loop of GEMMs
  // runs; reported:
  // the copies' bandwidth beside the GEMMs against alone, and the GEMMs' slowdown (issue goals: >= 64 KiB
  // pages at >= 0.8x idle bandwidth with <= 10% GEMM slowdown; 16 KiB at >= 0.5x the idle SM kernel).
#ifndef FLUXON_HAVE_CUBLAS
  std::printf("\nrestores and backups beside a bf16 GEMM: not measured (built without cuBLAS)\n");
#else
  std::printf("\nrestores and backups beside a saturating bf16 GEMM (cuBLAS 8192x8192x8192, its own stream)\n");
  {
    cublasHandle_t h;
    CB(cublasCreate(&h));
    const int M = 8192;
    void *A = nullptr, *B = nullptr, *C = nullptr;
    for (void** p : {&A, &B, &C}) {
      CK(cudaMalloc(p, size_t(M) * M * 2));
      CK(cudaMemset(*p, 0x3c, size_t(M) * M * 2));  // bf16 ~1.2e-2: finite products, no denormals
    }
    cudaStream_t gs, hi;
    CK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    int least = 0, greatest = 0;
    CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));
    CB(cublasSetStream(h, gs));
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm = [&] {
      CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, M, M, M, &alpha, A, CUDA_R_16BF, M, B, CUDA_R_16BF, M, &beta, C,
                      CUDA_R_16BF, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    const int loop = 40;
    const double gemm_alone = time_ms(gs, [&] { for (int i = 0; i < loop; ++i) gemm(); }, 3);
    std::printf("GEMM alone: %.3f ms each (%.0f TFLOP/s)\n", gemm_alone / loop,
                2.0 * M * M * double(M) / (gemm_alone / loop * 1e-3) / 1e12);
    std::printf("page      dir      path                alone GB/s  beside GB/s      x   GEMM slowdown\n");
    struct Variant {
      const char* name;
      CopyPath path;
      cudaStream_t stream;
      uint32_t ctas;  // kFewSm only
    };
    for (size_t page : {size_t(16) << 10, size_t(64) << 10}) {
      const size_t n = (256ull << 20) / page;
      Setup st(KvLayout{ValueLayout::kMla, 1, 16, page / 16}, n, host, host_bytes);
      const double gb = double(st.bytes()) / 1e9;
      for (auto dir : {Direction::kRestore, Direction::kBackup}) {
        for (const Variant& v : {Variant{"SM kernel", CopyPath::kSmKernel, s, 0},
                                 Variant{"SM, high prio", CopyPath::kSmKernel, hi, 0},
                                 Variant{"copy engine", CopyPath::kCopyEngine, s, 0},
                                 Variant{"few-SM 2 CTAs", CopyPath::kFewSm, s, 2},
                                 Variant{"few-SM 4 CTAs", CopyPath::kFewSm, s, 4},
                                 Variant{"few-SM 4, hi prio", CopyPath::kFewSm, hi, 4},
                                 Variant{"few-SM 8 CTAs", CopyPath::kFewSm, s, 8}}) {
          if (v.path == CopyPath::kFewSm) g.set_few_sm_ctas(v.ctas);
          const double alone = time_ms(v.stream, [&] { OK(g.copy(dir, st.copy(), v.stream, v.path)); });
          // Enough copies to outlast the GEMM loop; only those that end before it does are counted.
          const int copies = int(std::min(200.0, 2.0 * gemm_alone / alone + 4));
          std::vector<cudaEvent_t> ev(size_t(copies) + 1);
          for (auto& e : ev) CK(cudaEventCreate(&e));
          cudaEvent_t g0, g1;
          CK(cudaEventCreate(&g0));
          CK(cudaEventCreate(&g1));
          CK(cudaEventRecord(g0, gs));
          for (int i = 0; i < loop; ++i) gemm();
          CK(cudaEventRecord(g1, gs));
          CK(cudaStreamWaitEvent(v.stream, g0, 0));
          CK(cudaEventRecord(ev[0], v.stream));
          for (int i = 0; i < copies; ++i) {
            OK(g.copy(dir, st.copy(), v.stream, v.path));
            CK(cudaEventRecord(ev[size_t(i) + 1], v.stream));
          }
          CK(cudaEventSynchronize(g1));
          CK(cudaStreamSynchronize(v.stream));
          float gemm_beside = 0;
          CK(cudaEventElapsedTime(&gemm_beside, g0, g1));
          int done = 0;
          float span = 0;
          for (int i = 1; i <= copies; ++i) {
            float end = 0;
            CK(cudaEventElapsedTime(&end, g0, ev[size_t(i)]));
            if (end > gemm_beside) break;
            done = i;
            CK(cudaEventElapsedTime(&span, ev[0], ev[size_t(i)]));
          }
          const double beside = done > 0 ? gb * done / (span * 1e-3) : 0.0;
          char note[96] = "";
          if (done == 0)  // one copy outlasted the GEMM loop: its bandwidth there was below this
            std::snprintf(note, sizeof note, "  (no copy ended while the GEMMs ran: < %.1f GB/s)",
                          gb / (gemm_beside * 1e-3));
          std::printf("%-9zu %-8s %-18s %11.1f %12.1f %6.2f %10.1f%%%s\n", page,
                      dir == Direction::kRestore ? "restore" : "backup", v.name, gb / (alone * 1e-3), beside,
                      beside / (gb / (alone * 1e-3)), 100.0 * (gemm_beside / gemm_alone - 1.0), note);
          for (auto& e : ev) cudaEventDestroy(e);
          cudaEventDestroy(g0);
          cudaEventDestroy(g1);
        }
      }
    }
    g.set_few_sm_ctas(kFewSmCtas);
    CB(cublasDestroy(h));
    for (void* p : {A, B, C}) cudaFree(p);
  }
#endif
  (void)cuda_unregister_host(host);
  return 0;
}
