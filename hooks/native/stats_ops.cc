// Fused statistics kernel for DumpHook: one op reads its captured tensors once.
//
// Why: TensorFlow's stock ops take one pass (and often a temporary) per statistic, and one
// op launch per tensor and statistic: ~80 ms of op time per statistics step on a ResNet-8,
// against ~2 ms for a single read of the same tensors. This op computes per-sample moments
// in one vectorised pass, then buckets each tensor's histogram subsample while the tensor is
// still in cache; threads take whole tensors. DumpHook gives it one tensor per op (see
// fast_stats._native_stats), so each runs as soon as its tensor is ready.
//
// InspectorLogStats(xs, groups; batched, base, leaves, ngroups, max_elements, block)
//     -> stats [leaves, 8], hist_splits [leaves + 1], hist_index [N], hist_count [N]
//   Every tensor is split in rows: one per sample (dim 0) if batched, else one. Each row
//   belongs to an output row (a leaf): base[i] for the row of unbatched input i, base[i] + 1 +
//   groups[sample] for a sample of a batched one (groups in 0..ngroups, ngroups: in no group;
//   samples past groups' length: ngroups). A batched input has ngroups + 2 leaves: all, the
//   groups, none. Per leaf, over the finite values of its rows:
//   [elements, finite count, mean, m2 (sum of squared deviations), min, max, zeros, nans]
//   (mean 0, m2 0, min +inf, max -inf when none are finite);
//   a batched input's all leaf covers every sample. Why the leaves here and not in the graph:
//   one op per tensor made that a concat of [samples, 8] rows per tensor and some 40 small ops
//   after the last gradient, ~0.7 ms at the end of a VGG step on 2 cores.
//   Histograms: each row counts into its leaf's log-magnitude histogram (inspector/format/loghist.py:
//   8 buckets per power of two, signed, fixed global edges) the finite values of its
//   subsample (inspector.format.hist_sample: every k-th block of `block` elements, k =
//   ceil(tensor size / max_elements), or every k-th element when a row is not a multiple
//   of `block`); the all leaf's histogram sums its input's others. Leaf l's non-empty buckets,
//   ascending, are hist_index/hist_count[hist_splits[l], hist_splits[l + 1]).
//   finish=true: stats is [rows, 9] in inspector.format's STAT_COLUMNS order (count, mean, std,
//   min, max, l2, zero_fraction, nan, inf; NaN where no value is finite), computed exactly as
//   hooks/stats/fast.py's _finish computes them from the 8 columns, and the none leaf of every
//   batched input is left out of it and of the histograms (rows: the leaves in order, less
//   those). Why: in the graph that finish is ~25 small ops after the step's last gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace {

constexpr int64_t kChunk = 2048;  // elements per work unit (the length of the float sums)
constexpr int kStatColumns = 8;
constexpr int kFinishedColumns = 9;  // inspector.format.STAT_COLUMNS
// Log-magnitude buckets (inspector/format/loghist.py): signed indices -kMaxIndex..kMaxIndex, stored at
// slot index + kMaxIndex; slot kSlots takes NaN/Inf (discarded).
constexpr int32_t kMaxIndex = 2034;
constexpr int32_t kSlots = 2 * kMaxIndex + 1;

// The passes below are inlined into row_moments and bucket_any, which are compiled twice on x86:
// for AVX2 and for the baseline, chosen at load time by the CPU (GCC/Clang function
// multiversioning). AVX2 doubles the moments pass (13 -> 24 GB/s, the memory's speed here);
// FMA stays off so that every machine rounds the same.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__APPLE__)
#define INSPECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define INSPECTOR_CLONES
#endif
#define INSPECTOR_INLINE inline __attribute__((always_inline))
#define INSPECTOR_LAMBDA __attribute__((always_inline))  // a lambda's body is a function of its own

REGISTER_OP("InspectorLogStats")
    .Input("xs: T")
    .Input("groups: int32")
    .Output("stats: double")
    .Output("hist_splits: int64")
    .Output("hist_index: int32")
    .Output("hist_count: int32")
    .Attr("T: list({half, bfloat16, float, double})")
    .Attr("batched: list(bool)")
    .Attr("base: list(int)")
    .Attr("leaves: int >= 0")
    .Attr("ngroups: int >= 0 = 2")
    .Attr("max_elements: int >= 1")
    .Attr("block: int >= 1")
    .Attr("finish: bool = false")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t leaves;
      bool finish;
      std::vector<bool> batched;
      TF_RETURN_IF_ERROR(c->GetAttr("leaves", &leaves));
      TF_RETURN_IF_ERROR(c->GetAttr("finish", &finish));
      TF_RETURN_IF_ERROR(c->GetAttr("batched", &batched));
      const int64_t rows = finish ? leaves - std::count(batched.begin(), batched.end(), true) : leaves;
      c->set_output(0, c->Matrix(rows, finish ? kFinishedColumns : kStatColumns));
      c->set_output(1, c->Vector(rows + 1));
      c->set_output(2, c->Vector(c->UnknownDim()));
      c->set_output(3, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

// A row of one input tensor, as a typed pointer range.
struct Row {
  const void* data;
  DataType dtype;
  int64_t size;        // elements in the row
  int64_t tensor_size; // elements in the whole tensor (the histogram stride)
};

// Partial moments of a run of values, merged with Chan et al.'s parallel formula.
struct Moments {
  double n = 0, mean = 0, m2 = 0, mn = std::numeric_limits<double>::infinity(),
         mx = -std::numeric_limits<double>::infinity(), zeros = 0, nans = 0;
  void merge(const Moments& o) {
    if (n == 0) {  // not the formula: delta^2 * 0 is NaN when delta^2 overflows (|mean| > 1e154)
      *this = Moments{o.n, o.mean, o.m2, o.mn, o.mx, zeros + o.zeros, nans + o.nans};
      return;
    }
    if (o.n > 0) {
      const double total = n + o.n, delta = o.mean - mean;
      mean += delta * (o.n / total);
      m2 += o.m2 + delta * delta * (n * o.n / total);
      n = total;
      mn = std::min(mn, o.mn);
      mx = std::max(mx, o.mx);
    }
    zeros += o.zeros;
    nans += o.nans;
  }
};

// Arithmetic type of a tensor type: float (double for double tensors). Half and bfloat16
// values convert to float exactly, so their histogram buckets are their own values'.
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using Acc = typename AccOf<T>::type;

// fn(typed pointer to the row's first element), for every dtype the op accepts.
template <typename Fn>
INSPECTOR_INLINE void with_typed(const Row& r, Fn fn) {
  switch (r.dtype) {
    case DT_FLOAT: fn(static_cast<const float*>(r.data)); break;
    case DT_DOUBLE: fn(static_cast<const double*>(r.data)); break;
    case DT_HALF: fn(static_cast<const Eigen::half*>(r.data)); break;
    case DT_BFLOAT16: fn(static_cast<const bfloat16*>(r.data)); break;
    default: break;  // the op's type constraint admits no other
  }
}

// The bits of an arithmetic type: masks are integer operations, which GCC vectorises where it
// leaves a float select with NaN operands scalar (14 ms instead of 1.8 ms per 16 MiB).
template <typename A> struct Bits;
template <> struct Bits<float> { using U = uint32_t; static constexpr U kExp = 0x7f800000u; };
template <> struct Bits<double> { using U = uint64_t; static constexpr U kExp = 0x7ff0000000000000ull; };

// Moments of values[0, len) when some are NaN/Inf: the fast pass with the non-finite values
// masked, deviations taken from `pivot` (finite). Why vectorised: a diverged network's tensors
// are all NaN, and that is when its statistics are looked at; the scalar pass this replaces
// ran at 2-3 GB/s instead of 6.
template <typename T, typename A = Acc<T>>
INSPECTOR_INLINE Moments masked_pass(const T* v, int64_t len, A pivot) {
  using U = typename Bits<A>::U;
  constexpr U kExp = Bits<A>::kExp, kAbs = ~(U(1) << (8 * sizeof(U) - 1));
  U pivot_bits;
  std::memcpy(&pivot_bits, &pivot, sizeof pivot_bits);
  A s1 = 0, s2 = 0, n = 0, nans = 0;  // n, nans: exact, a chunk has at most kChunk elements
  A mn = std::numeric_limits<A>::infinity(), mx = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(+ : s1, s2, n, nans) reduction(min : mn) reduction(max : mx)
  for (int64_t i = 0; i < len; ++i) {
    const A x = static_cast<A>(v[i]);
    U b;
    std::memcpy(&b, &x, sizeof b);
    const U finite = (b & kExp) != kExp ? ~U(0) : U(0);  // all ones unless NaN or +-Inf
    const U kept = (b & finite) | (pivot_bits & ~finite);  // a non-finite value becomes the pivot
    A xf;
    std::memcpy(&xf, &kept, sizeof xf);
    const A d = xf - pivot;
    s1 += d;
    s2 += d * d;
    n += static_cast<A>(finite & 1);
    nans += static_cast<A>((b & kAbs) > kExp ? 1 : 0);
    mn = xf < mn ? xf : mn;  // a pivot among the finite values leaves min/max unchanged
    mx = xf > mx ? xf : mx;
  }
  Moments m;
  m.nans = static_cast<double>(nans);
  if (n > 0) {
    const double d1 = static_cast<double>(s1);
    m.n = static_cast<double>(n);
    m.mean = static_cast<double>(pivot) + d1 / m.n;
    m.m2 = std::max(0.0, static_cast<double>(s2) - d1 * d1 / m.n);
    m.mn = static_cast<double>(mn);
    m.mx = static_cast<double>(mx);
  }
  return m;
}

// masked_pass with a pivot among the values (a non-finite value stands in for the pivot, so
// the pivot must be finite and one of them): the first finite one of the first 64; past
// those, a probe pass counts the finite values first, so a chunk of NaN only is one pass.
template <typename T, typename A = Acc<T>>
INSPECTOR_INLINE Moments masked_moments(const T* v, int64_t len) {
  for (int64_t i = 0; i < std::min<int64_t>(len, 64); ++i) {
    const A x = static_cast<A>(v[i]);
    if (std::isfinite(x)) return masked_pass(v, len, x);
  }
  const Moments probe = masked_pass(v, len, A(0));  // its n and nans are right, its min/max not
  if (probe.n == 0) return probe;
  int64_t first = 64;
  while (!std::isfinite(static_cast<A>(v[first]))) ++first;  // probe.n > 0: one exists
  return masked_pass(v, len, static_cast<A>(v[first]));
}

// Exact two-pass moments in double over the finite values: the last resort, for finite
// values whose squares overflow the arithmetic type.
template <typename T, typename A = Acc<T>>
Moments exact_moments(const T* v, int64_t len) {
  Moments m;
  double s = 0, n = 0;
  for (int64_t i = 0; i < len; ++i) {
    const double x = static_cast<double>(static_cast<A>(v[i]));
    if (std::isnan(x)) { m.nans += 1; continue; }
    if (!std::isfinite(x)) continue;
    s += x;
    n += 1;
    m.mn = std::min(m.mn, x);
    m.mx = std::max(m.mx, x);
  }
  if (n > 0) {
    m.n = n;
    m.mean = s / n;
    for (int64_t i = 0; i < len; ++i) {
      const double x = static_cast<double>(static_cast<A>(v[i]));
      if (std::isfinite(x)) m.m2 += (x - m.mean) * (x - m.mean);
    }
  }
  return m;
}

// Moments of values[0, len): one vectorised pass; if a value is NaN/Inf (or the squares
// overflow), the masked pass, and for overflowing doubles the exact one.
//
// The pass keeps kSumLanes partial sums of each kind, two AVX2 vectors, each lane summing
// every kSumLanes-th value in order, then adds the lanes in order: two chains of adds instead
// of one (one was bound by the adds' latency on cached data), and the same rounding on every
// machine whichever clone runs (an `omp simd` reduction's order follows the vector width).
// Each step prefetches the line kAhead bytes on: a separate prefetch loop per chunk cost more
// than it saved on a tensor still in cache, where a captured tensor usually is (standalone,
// one thread: 1 MiB 29 -> 40 GB/s, 4-64 MiB 17-18 -> 30, 256 MiB from memory 8.9 -> 10).
constexpr int64_t kAhead = 8192;
template <typename T, typename A = Acc<T>>
INSPECTOR_INLINE Moments chunk_moments(const T* v, int64_t len) {
  // Sums of deviations from a pivot (the chunk's first value): one pass, and no cancellation
  // in m2 = s2 - s1^2 / n as long as the pivot is within a few std of the mean.
  const A pivot = len > 0 ? static_cast<A>(v[0]) : A(0);
  constexpr int kSumLanes = 64 / sizeof(A);  // a step reads at most one 64-byte line of T
  A ls1[kSumLanes], ls2[kSumLanes], lz[kSumLanes], lmn[kSumLanes], lmx[kSumLanes];
  for (int k = 0; k < kSumLanes; ++k) {
    ls1[k] = ls2[k] = lz[k] = 0;  // zeros: exact, a chunk has at most kChunk elements
    lmn[k] = std::numeric_limits<A>::infinity();
    lmx[k] = -std::numeric_limits<A>::infinity();
  }
  auto add = [&](int k, A x) INSPECTOR_LAMBDA {
    const A d = x - pivot;
    ls1[k] += d;
    ls2[k] += d * d;
    lmn[k] = x < lmn[k] ? x : lmn[k];
    lmx[k] = x > lmx[k] ? x : lmx[k];
    lz[k] += x == A(0) ? A(1) : A(0);
  };
  const int64_t body = len - len % kSumLanes;
  for (int64_t i = 0; i < body; i += kSumLanes) {
    __builtin_prefetch(reinterpret_cast<const char*>(v + i) + kAhead);
#pragma omp simd
    for (int k = 0; k < kSumLanes; ++k) add(k, static_cast<A>(v[i + k]));
  }
  for (int64_t i = body; i < len; ++i) add(static_cast<int>(i - body), static_cast<A>(v[i]));
  A s1 = 0, s2 = 0, zeros = 0;
  A mn = std::numeric_limits<A>::infinity(), mx = -std::numeric_limits<A>::infinity();
  for (int k = 0; k < kSumLanes; ++k) {
    s1 += ls1[k];
    s2 += ls2[k];
    zeros += lz[k];
    mn = lmn[k] < mn ? lmn[k] : mn;
    mx = lmx[k] > mx ? lmx[k] : mx;
  }
  Moments m;
  if (std::isfinite(s2) && std::isfinite(mn) && std::isfinite(mx)) {  // NaN/Inf make s2 NaN/Inf
    const double n = static_cast<double>(len), d1 = static_cast<double>(s1);
    m.n = n;
    m.mean = static_cast<double>(pivot) + d1 / n;
    m.m2 = std::max(0.0, static_cast<double>(s2) - d1 * d1 / n);
    m.mn = static_cast<double>(mn);
    m.mx = static_cast<double>(mx);
  } else {
    m = masked_moments(v, len);
    if (!std::isfinite(m.m2) || !std::isfinite(m.mean)) m = exact_moments(v, len);  // squares overflowed
  }
  m.zeros = static_cast<double>(zeros);
  return m;
}

// The histogram slot of x (inspector/format/loghist.py's index + kMaxIndex; kSlots for NaN/Inf): the
// magnitude's exponent and three leading mantissa bits, from the bit pattern, so every machine
// and the numpy reference agree exactly. Half and bfloat16 values are exact in float.
INSPECTOR_INLINE int32_t slot(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  const uint32_t mag = b & 0x7fffffffu;
  int32_t k = static_cast<int32_t>(mag >> 20) - 6;
  k = k < 1 ? 1 : k;            // subnormals: the floor bucket
  k = mag == 0 ? 0 : k;
  const int32_t s = (b >> 31) ? kMaxIndex - k : kMaxIndex + k;
  return mag >= 0x7f800000u ? kSlots : s;
}
INSPECTOR_INLINE int32_t slot(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  const uint64_t mag = b & 0x7fffffffffffffffull;
  int64_t k = static_cast<int64_t>(mag >> 49) - 7174;
  k = k < 1 ? 1 : (k > kMaxIndex ? kMaxIndex : k);
  k = mag == 0 ? 0 : k;
  const int32_t s = static_cast<int32_t>((b >> 63) ? kMaxIndex - k : kMaxIndex + k);
  return mag >= 0x7ff0000000000000ull ? kSlots : s;
}

// Histogram counts of one leaf: kLanes interleaved copies of the kWidth slots (value i of a span
// counts in lane i % kLanes, so runs of one slot, a ReLU output's zeros, do not wait on the
// previous increment's store), and the slots [lo, hi] that may be non-zero: the extraction
// reads and re-zeroes only those, not every slot of every leaf.
constexpr int kLanes = 4;
constexpr int64_t kWidth = kSlots + 1;
struct Hist {
  int32_t* counts;  // [kLanes][kWidth], all zero outside [lo, hi]
  int32_t lo = kSlots + 1, hi = -1;
};

// Count len values (every `step`-th from v) into h: the slots of a span in one vectorised
// loop (with their range), then the increments alone.
template <typename T>
INSPECTOR_INLINE void bucket_values(const T* v, int64_t len, int64_t step, Hist& h) {
  using A = Acc<T>;
  constexpr int64_t kSpan = 512;
  int32_t idx[kSpan];
  for (int64_t start = 0; start < len; start += kSpan) {
    const int64_t n = std::min<int64_t>(kSpan, len - start);
    const T* p = v + start * step;
    int32_t lo = h.lo, hi = h.hi;
    if (step == 1) {
#pragma omp simd reduction(min : lo) reduction(max : hi)
      for (int64_t i = 0; i < n; ++i) {
        idx[i] = slot(static_cast<A>(p[i]));
        lo = idx[i] < lo ? idx[i] : lo;
        hi = idx[i] > hi ? idx[i] : hi;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        idx[i] = slot(static_cast<A>(p[i * step]));
        lo = std::min(lo, idx[i]);
        hi = std::max(hi, idx[i]);
      }
    }
    h.lo = lo;
    h.hi = hi;
    const int64_t body = n - n % kLanes;
    for (int64_t i = 0; i < body; i += kLanes)
      for (int k = 0; k < kLanes; ++k) ++h.counts[k * kWidth + idx[i + k]];
    for (int64_t i = body; i < n; ++i) ++h.counts[idx[i]];
  }
}

// One row's histogram subsample (inspector.format.hist_sample) into h.
template <typename T>
INSPECTOR_INLINE void bucket_row(const T* v, int64_t size, int64_t stride, int64_t block, Hist& h) {
  if (size % block == 0) {
    for (int64_t j = 0; j < size; j += stride * block) bucket_values(v + j, block, 1, h);
  } else {
    bucket_values(v, (size + stride - 1) / stride, stride, h);
  }
}

// Moments of one row: chunks of kChunk elements merged in double.
INSPECTOR_CLONES Moments row_moments(const Row& row) {
  Moments acc;
  with_typed(row, [&](auto* v) INSPECTOR_LAMBDA {
    for (int64_t start = 0; start < row.size; start += kChunk)
      acc.merge(chunk_moments(v + start, std::min(kChunk, row.size - start)));
  });
  return acc;
}

INSPECTOR_CLONES void bucket_any(const Row& row, int64_t max_elements, int64_t block, Hist& hist) {
  const int64_t stride = std::max<int64_t>(1, (row.tensor_size + max_elements - 1) / max_elements);
  with_typed(row, [&](auto* v) INSPECTOR_LAMBDA { bucket_row(v, row.size, stride, block, hist); });
}

// The counts of slot b of h, summed over its lanes, which are zeroed.
INSPECTOR_INLINE int32_t take(Hist& h, int32_t b) {
  int32_t c = 0;
  for (int k = 0; k < kLanes; ++k) {
    c += h.counts[k * kWidth + b];
    h.counts[k * kWidth + b] = 0;
  }
  return c;
}

// The histograms' buffer of this thread: [leaves][kLanes][kWidth], all zero between uses
// (each use re-zeroes the ranges it touched), so an op pays for the slots its values reach,
// not for clearing and scanning every slot of every leaf.
std::vector<int32_t>& hist_buffer(int64_t leaves) {
  thread_local std::vector<int32_t> buffer;
  const size_t need = static_cast<size_t>(leaves * kLanes * kWidth);
  if (buffer.size() < need) buffer.resize(need, 0);
  return buffer;
}

class StatsOp : public OpKernel {
 public:
  explicit StatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("batched", &batched_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("base", &base_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("leaves", &leaves_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ngroups", &ngroups_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_elements", &max_elements_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("block", &block_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("finish", &finish_));
    OP_REQUIRES(ctx, batched_.size() == base_.size(),
                errors::InvalidArgument("batched and base differ in length"));
    std::vector<std::pair<int64_t, int64_t>> spans;  // each input's leaves: [base, base + count)
    for (size_t i = 0; i < base_.size(); ++i) {
      spans.emplace_back(base_[i], base_[i] + (batched_[i] ? ngroups_ + 2 : 1));
      OP_REQUIRES(ctx, base_[i] >= 0 && spans.back().second <= leaves_,
                  errors::InvalidArgument("base[", i, "] = ", base_[i], " is out of range for ", leaves_, " leaves"));
    }
    // threads write each input's leaves unlocked: two inputs may not share one
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      OP_REQUIRES(ctx, spans[i].first >= spans[i - 1].second,
                  errors::InvalidArgument("two inputs' leaves overlap at leaf ", spans[i].first, ": base must give "
                                          "each input its own leaves (1, or ngroups + 2 when batched)"));
    // the output row of each leaf: itself, or with finish the leaves less the none ones (-1)
    out_row_.assign(leaves_, 0);
    if (finish_)
      for (size_t i = 0; i < base_.size(); ++i)
        if (batched_[i]) out_row_[base_[i] + ngroups_ + 1] = -1;
    rows_out_ = 0;
    for (auto& r : out_row_) r = r < 0 ? -1 : rows_out_++;
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList xs;
    OP_REQUIRES_OK(ctx, ctx->input_list("xs", &xs));
    OP_REQUIRES(ctx, static_cast<size_t>(xs.size()) == batched_.size(),
                errors::InvalidArgument("batched has ", batched_.size(), " entries for ", xs.size(), " inputs"));
    const Tensor& groups_t = ctx->input(xs.size());
    const int64_t n_groups = groups_t.NumElements();
    const int32_t* groups = groups_t.flat<int32_t>().data();
    for (int64_t g = 0; g < n_groups; ++g)
      OP_REQUIRES(ctx, groups[g] >= 0 && groups[g] <= ngroups_,
                  errors::InvalidArgument("groups[", g, "] = ", groups[g], ": must be in 0..", ngroups_));
    // Rows of every input, and where each input's rows start.
    std::vector<Row> rows;
    std::vector<int64_t> first_row(xs.size() + 1, 0);
    std::vector<int32_t> leaf;  // the output row of each row
    for (int i = 0; i < xs.size(); ++i) {
      const Tensor& x = xs[i];
      const bool b = batched_[i] && x.dims() >= 1;
      const int64_t n = b ? x.dim_size(0) : 1, size = x.NumElements();
      const int64_t per = n > 0 ? size / n : 0;
      const char* data = static_cast<const char*>(x.data());
      for (int64_t s = 0; s < n; ++s) {
        rows.push_back(Row{data + s * per * DataTypeSize(x.dtype()), x.dtype(), per, size});
        leaf.push_back(static_cast<int32_t>(
            b ? base_[i] + 1 + (s < n_groups ? groups[s] : ngroups_) : base_[i]));
      }
      first_row[i + 1] = rows.size();
    }
    Tensor* stats = nullptr;
    const int width = finish_ ? kFinishedColumns : kStatColumns;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows_out_, width}), &stats));
    double* out = stats->flat<double>().data();
    // leaves of no input (none when called by fast_stats): zeros, finished as such
    std::fill(out, out + rows_out_ * width, 0.0);
    if (finish_)
      for (int64_t l = 0; l < leaves_; ++l)
        if (out_row_[l] >= 0) write_row(Moments{0, 0, 0, 0, 0, 0, 0}, 0.0, out + width * out_row_[l]);
    // Each leaf's non-empty buckets as (signed index, count), filled by the thread of its input.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> buckets(leaves_);
    // One input at a time per thread: its moments pass, then its histogram pass while the
    // tensor is still in cache. An input's leaves belong to it alone: no shared writes.
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t nleaf = batched_[i] ? ngroups_ + 2 : 1;
        std::vector<Moments> by_leaf(nleaf);
        std::vector<double> elements(nleaf, 0.0);
        for (int64_t r = first_row[i]; r < first_row[i + 1]; ++r) {
          by_leaf[leaf[r] - base_[i]].merge(row_moments(rows[r]));
          elements[leaf[r] - base_[i]] += static_cast<double>(rows[r].size);
        }
        // the all leaf: every other leaf (an unbatched input's one row is its leaf 0)
        Moments all;
        for (const Moments& mo : by_leaf) all.merge(mo);
        by_leaf[0] = all;
        elements[0] = std::accumulate(elements.begin(), elements.end(), 0.0);
        for (int64_t l = 0; l < nleaf; ++l)
          if (out_row_[base_[i] + l] >= 0) write_row(by_leaf[l], elements[l], out + width * out_row_[base_[i] + l]);
        int32_t* counts = hist_buffer(nleaf).data();
        std::vector<Hist> hists(nleaf);
        for (int64_t l = 0; l < nleaf; ++l) hists[l].counts = counts + l * kLanes * kWidth;
        for (int64_t r = first_row[i]; r < first_row[i + 1]; ++r)
          bucket_any(rows[r], max_elements_, block_, hists[leaf[r] - base_[i]]);
        // Each other leaf's counts, summed over lanes into its lane 0 and added to the all
        // leaf's lane 0 (an unbatched input's one leaf is its all leaf).
        Hist& all_h = hists[0];
        for (int64_t l = 1; l < nleaf; ++l) {
          Hist& h = hists[l];
          for (int32_t b = h.lo; b <= h.hi; ++b) {
            const int32_t c = take(h, b);
            h.counts[b] = c;
            all_h.counts[b] += c;
          }
          all_h.lo = std::min(all_h.lo, h.lo);
          all_h.hi = std::max(all_h.hi, h.hi);
        }
        for (int64_t l = 0; l < nleaf; ++l) {  // slot kSlots (NaN/Inf) is zeroed, not kept
          Hist& h = hists[l];
          auto& found = buckets[base_[i] + l];
          const bool kept = out_row_[base_[i] + l] >= 0;
          for (int32_t b = h.lo; b <= h.hi; ++b) {
            const int32_t c = take(h, b);
            if (c != 0 && b < kSlots && kept) found.emplace_back(b - kMaxIndex, c);
          }
        }
      }
    };
    int64_t total = 0;
    for (const Row& r : rows) total += r.size;
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(pool->num_threads, pool->workers, xs.size(), 4 * (1 + total / std::max<int64_t>(1, xs.size())), work);
    int64_t n = 0;
    for (const auto& found : buckets) n += static_cast<int64_t>(found.size());
    Tensor *splits = nullptr, *index = nullptr, *count = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({rows_out_ + 1}), &splits));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &index));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n}), &count));
    int64_t* sp = splits->flat<int64_t>().data();
    int32_t* ix = index->flat<int32_t>().data();
    int32_t* ct = count->flat<int32_t>().data();
    int64_t at = 0;
    for (int64_t l = 0; l < leaves_; ++l) {
      if (out_row_[l] < 0) continue;
      sp[out_row_[l]] = at;
      for (const auto& [b, c] : buckets[l]) {
        ix[at] = b;
        ct[at++] = c;
      }
    }
    sp[rows_out_] = at;
  }

 private:
  // One output row of a leaf's moments over `elements` values: the 8 raw columns, or with
  // finish the 9 STAT_COLUMNS by fast.py's _finish, op for op in double (mean through
  // s = n * mean and back, as the graph did), so either path records the same bits.
  void write_row(const Moments& mo, double elements, double* row) const {
    if (!finish_) {
      const double vals[kStatColumns] = {elements, mo.n, mo.mean, mo.m2, mo.mn, mo.mx, mo.zeros, mo.nans};
      std::copy(vals, vals + kStatColumns, row);
      return;
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double c = mo.n, s = c * mo.mean, c1 = std::max(c, 1.0);
    const double m2 = std::max(mo.m2, 0.0), mean = s / c1;
    const bool has = c > 0;
    const double vals[kFinishedColumns] = {
        elements, has ? mean : nan, has ? std::sqrt(m2 / c1) : nan, has ? mo.mn : nan,
        has ? mo.mx : nan, std::sqrt(m2 + c * (mean * mean)), mo.zeros / std::max(elements, 1.0),
        mo.nans, (elements - c) - mo.nans};
    std::copy(vals, vals + kFinishedColumns, row);
  }

  std::vector<bool> batched_;
  std::vector<int64_t> base_;
  int64_t leaves_;
  int64_t ngroups_;
  int64_t max_elements_;
  int64_t block_;
  bool finish_;
  std::vector<int64_t> out_row_;  // per leaf: its output row, -1 when left out
  int64_t rows_out_;
};

REGISTER_KERNEL_BUILDER(Name("InspectorLogStats").Device(DEVICE_CPU), StatsOp);

}  // namespace
}  // namespace tensorflow
