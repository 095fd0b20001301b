// The PTX instructions latentkv's kernels use, one wrapper each, grouped by the architecture they
// need. An instruction newer than the architecture being compiled compiles to a trap-free
// stand-in (nothing, or a wait that returns at once): such code never runs there, because the
// strategy's row refuses a device below the instruction's compute capability (strategies.cpp).
//   sm_80: cp.async (16 bytes, zero-fill; groups), ldmatrix, mma.sync m16n8k16 (bf16/fp16, f32
//          accumulate) and m16n8k8 (tf32)
//   sm_90: mbarrier with transaction counts, cp.async.bulk.tensor (TMA), programmatic dependent
//          launch (PDL), thread-block clusters (rank, barrier, distributed shared memory)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/cuda_check.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LATENTKV_SM80 1
#else
#define LATENTKV_SM80 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LATENTKV_SM90 1
#else
#define LATENTKV_SM90 0
#endif

namespace latentkv::detail {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One 16-byte vector (uint4, or float4 for float32 rows) through the non-coherent path (data
// read once: weights).
template <typename V = uint4>
__device__ __forceinline__ V load_vector(const void* p) {
  static_assert(sizeof(V) == 16, "a 16-byte vector");
  return __ldg(reinterpret_cast<const V*>(p));
}

// ---- sm_80 ----

// 16 bytes global -> shared without registers; zeros instead when !valid (nothing is read then).
// Before sm_80, a plain load and store (the copy is complete on return).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
#if LATENTKV_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void wait_async_copies() {
#if LATENTKV_SM80
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// Closes this thread's cp.async copies issued so far into a group; wait_copies<N> waits until at
// most N of its groups are still in flight.
__device__ __forceinline__ void commit_copies() {
#if LATENTKV_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wait_copies() {
#if LATENTKV_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}
// wait_copies for a count known only after unrolling (a constant once the loop is unrolled, so the
// switch folds away); counts past 7 wait for every group.
__device__ __forceinline__ void wait_copies_pending(int pending) {
  switch (pending) {
    case 7: wait_copies<7>(); break;
    case 6: wait_copies<6>(); break;
    case 5: wait_copies<5>(); break;
    case 4: wait_copies<4>(); break;
    case 3: wait_copies<3>(); break;
    case 2: wait_copies<2>(); break;
    case 1: wait_copies<1>(); break;
    default: wait_copies<0>(); break;
  }
}

// Four 8x8 16-bit matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8. The .trans form hands each thread a column pair instead of a row pair.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
#if LATENTKV_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
#if LATENTKV_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

// d[16 x 8] += a[16 x 16] @ b[16 x 8], float32 accumulation.
template <typename E>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
#if LATENTKV_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
#if LATENTKV_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// ---- sm_90 ----

// Thread-block clusters: this block's rank, the split cluster barrier (arrive, then wait), and a
// 16-byte read of another block's shared memory.
__device__ __forceinline__ uint32_t cluster_block_rank() {
  uint32_t r = 0;
#if LATENTKV_SM90
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
#if LATENTKV_SM90
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if LATENTKV_SM90
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// 16 bytes of block `rank`'s shared memory at the address `local` has in this block.
__device__ __forceinline__ float4 load_cluster_shared(const float* local, uint32_t rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if LATENTKV_SM90
  uint32_t remote = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(shared_address(local)), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}


// A shared-memory mbarrier with one arrival per phase, completed by the copy engine's bytes.
__device__ __forceinline__ void init_barrier(uint64_t* bar) {
#if LATENTKV_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(bar)));
#endif
}
// Makes the barriers' initialization visible to the copy engine.
__device__ __forceinline__ void publish_barrier_init() {
#if LATENTKV_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives on the barrier, expecting `bytes` more from bulk copies in this phase.
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t bytes) {
#if LATENTKV_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// Waits until the barrier's phase `parity` has completed.
__device__ __forceinline__ void wait_barrier(uint64_t* bar, uint32_t parity) {
#if LATENTKV_SM90
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
#endif
}
// One box of a 2D tensor map, at element coordinates (col, row), into shared memory; completes
// on `bar` (complete_tx).
__device__ __forceinline__ void bulk_tensor_copy_2d(void* dst, const void* map, int col, int row,
                                                    uint64_t* bar) {
#if LATENTKV_SM90
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(shared_address(bar))
      : "memory");
#endif
}

// Programmatic dependent launch, from inside a kernel: let the next kernel in the stream start
// launching; wait until the previous one has finished and its memory is visible. Both matter only
// when the kernel after is launched with cudaLaunchAttributeProgrammaticStreamSerialization;
// below sm_90 stream order alone holds.
__device__ __forceinline__ void allow_dependents() {
#if LATENTKV_SM90
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
__device__ __forceinline__ void wait_for_previous_stage() {
#if LATENTKV_SM90
  cudaGridDependencySynchronize();
#endif
}
// Asks L2 for the 128-byte line holding `address` and returns at once; nothing reaches the SM.
// Allowed before wait_for_previous_stage(): L2 is where every SM's writes meet, so a load after
// the wait still sees what the kernel before wrote after this prefetch.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

// The first lines of a kernel launched by launch_after_previous: every global memory access waits
// until the previous kernel has finished, then the stream's next kernel may launch. Wait first:
// a dependent's work before its own wait (K2's gamma, slot, position and cos/sin, K3's kv_b, a
// caller's prologue) then still starts after everything before this kernel, as behind a plain
// launch; triggering first would let it overlap the kernel before this one.
__device__ __forceinline__ void start_after_previous_kernel() {
  wait_for_previous_stage();
  allow_dependents();
}

// d[16 x 8] += a[16 x 8] @ b[8 x 8], tf32 operands (float32 bit patterns: the tensor cores read
// the sign, exponent and top 10 mantissa bits), float32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if LATENTKV_SM80
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The 3xTF32 halves of a float32: big = x with its low 13 mantissa bits cleared (a tf32), small =
// x - big (exact in float32; the MMA reads its top 11 bits, so big + small is x to 2^-21
// relative). Two instructions, where cvt.rna.tf32 compiles to four on sm_90. With a * b taken as
// small(a) big(b) + big(a) small(b) + big(a) big(b) (small * small is below float32's rounding),
// float32 products come out of the tf32 tensor cores to ~1e-6.
struct Split {
  uint32_t big, small;
};
// The mask is an opaque (volatile) instruction, so that ptxas splits each fragment where it is
// loaded instead of hoisting every split ahead of the MMAs (twice the live registers: spills).
__device__ __forceinline__ Split split_tf32(float x) {
  uint32_t big;
  asm volatile("and.b32 %0, %1, 0xffffe000;\n" : "=r"(big) : "r"(__float_as_uint(x)));
  return {big, __float_as_uint(x - __uint_as_float(big))};
}

// An m16n8k8 A fragment's four elements, split.
struct SplitA {
  uint32_t big[4], small[4];
  __device__ __forceinline__ explicit SplitA(const float (&x)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const Split s = split_tf32(x[i]);
      big[i] = s.big;
      small[i] = s.small;
    }
  }
};

// One 16 x 8 x 8 step in 3xTF32: small(a) big(b) into sb, big(a) small(b) into bs, big(a) big(b)
// into bb (three chains, or one where they are the same accumulator; the small products first,
// so they are not lost against the big product's magnitude).
__device__ __forceinline__ void mma_3xtf32(float (&sb)[4], float (&bs)[4], float (&bb)[4],
                                           const SplitA& a, Split b0, Split b1) {
  mma_tf32(sb, a.small, b0.big, b1.big);
  mma_tf32(bs, a.big, b0.small, b1.small);
  mma_tf32(bb, a.big, b0.big, b1.big);
}

// Host side: the virtual architecture `Kernel` was compiled for on the current device (90 for
// sm_90a code, 80 where a binary built for sm_80 alone runs on Hopper from compute_80 PTX; 0 when
// the query fails). Code compiled below an instruction's architecture holds the stand-ins above,
// so a strategy whose kernels need sm_90 (or sm_80) checks this, not only the device. Asked once
// per kernel.
template <auto Kernel>
int compiled_arch() {
  static const int arch = [] {
    const RelaxedCaptureScope relaxed;  // the first call may come inside a graph capture
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, Kernel) == cudaSuccess ? attributes.ptxVersion : 0;
  }();
  return arch;
}

// May `Kernel` be launched as a programmatic dependent of the kernel before it (with
// cudaLaunchAttributeProgrammaticStreamSerialization) on a device of compute capability `major`?
// Only where both the device and the code the driver runs are sm_90: compute_80 code's
// wait_for_previous_stage() is empty, so a programmatic launch of it would race. Stream order
// alone is always correct.
template <auto Kernel>
bool programmatic_launch_allowed(int major) {
  return major >= 9 && compiled_arch<Kernel>() >= 90;
}

// The programmatic-dependent-launch attribute.
inline cudaLaunchAttribute programmatic_attribute() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

// A launch's attribute list: the programmatic-dependent-launch attribute where `programmatic`,
// then `extra` (a cluster dimension, a shared-memory carveout) where not null. on(config) returns
// the config carrying the list, which points into this object: keep it alive until the launch.
struct LaunchAttributes {
  cudaLaunchAttribute list[2] = {};
  unsigned count = 0;
  LaunchAttributes(bool programmatic, const cudaLaunchAttribute* extra) {
    if (programmatic) list[count++] = programmatic_attribute();
    if (extra != nullptr) list[count++] = *extra;
  }
  LaunchAttributes(const LaunchAttributes&) = delete;
  LaunchAttributes& operator=(const LaunchAttributes&) = delete;
  cudaLaunchConfig_t on(cudaLaunchConfig_t config) {
    config.attrs = list;
    config.numAttrs = count;
    return config;
  }
};

// A launch configuration of `threads` per block on `stream` with no attributes: each launch sets
// its grid and dynamic shared memory and takes its attributes from LaunchAttributes::on.
inline cudaLaunchConfig_t plain_launch_config(unsigned threads, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(threads);
  config.stream = stream;
  return config;
}

// Launches Kernel(params) over (grid, threads, smem) on `stream` as a programmatic dependent of
// the kernel before it in the stream where programmatic_launch_allowed (else in plain stream
// order), with `extra` (a cluster dimension, say) as a second launch attribute where not null.
// Kernel calls start_after_previous_kernel() before its first access to global memory: its blocks
// may then be resident and through their launch before the previous kernel (the caller's, or our
// previous call's) has ended.
template <typename P>
P kernel_parameter(void (*)(P));  // declared only: the parameter type of a one-argument kernel
template <auto Kernel, typename Params>
cudaError_t launch_after_previous(dim3 grid, unsigned threads, size_t smem, cudaStream_t stream,
                                  int major, const Params& params,
                                  const cudaLaunchAttribute* extra = nullptr) {
  static_assert(std::is_same_v<decltype(kernel_parameter(Kernel)), Params>,
                "params is the kernel's own parameter type (a derived one would be sliced)");
  cudaLaunchConfig_t plain = plain_launch_config(threads, stream);
  plain.gridDim = grid;
  plain.dynamicSmemBytes = smem;
  LaunchAttributes attributes(programmatic_launch_allowed<Kernel>(major), extra);
  const cudaLaunchConfig_t config = attributes.on(plain);
  const cudaError_t err = cudaLaunchKernelEx(&config, Kernel, params);
  if (err != cudaSuccess) (void)cudaGetLastError();  // returned, not left for the caller's check
  return err;
}

}  // namespace latentkv::detail
