// The one list of element types the native kernels handle.
//
// Every kernel works on the raw bits of an element (an unsigned integer of the
// same width) and orders elements by an "ordered key" derived from those bits
// (see keys.h). Adding a dtype is one line here; the CPU and GPU dispatchers,
// the FFI handlers and the Python side (through the module's `dtypes()` list)
// all read this table.
#pragma once

#include <cstdint>

namespace jax_topk {

// How the bits of an element map to an order-preserving unsigned key.
enum class KeyKind : int {
  kFloat = 0,     // IEEE-754: total order, -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN
  kSigned = 1,    // two's complement integer
  kUnsigned = 2,  // unsigned integer: the bits are the key
};

// X(numpy_name, XLA_FFI_DataType suffix, storage type, key kind, bits of the
//   lowest value: -inf for floats, the minimum for integers; what padded
//   output slots hold)
#define JAX_TOPK_FOR_EACH_DTYPE(X)                                 \
  X(float32, F32, uint32_t, kFloat, 0xFF800000u)                   \
  X(bfloat16, BF16, uint16_t, kFloat, 0xFF80u)                     \
  X(float16, F16, uint16_t, kFloat, 0xFC00u)                       \
  X(float64, F64, uint64_t, kFloat, 0xFFF0000000000000ull)         \
  X(int32, S32, uint32_t, kSigned, 0x80000000u)                    \
  X(int64, S64, uint64_t, kSigned, 0x8000000000000000ull)          \
  X(int16, S16, uint16_t, kSigned, 0x8000u)                        \
  X(int8, S8, uint8_t, kSigned, 0x80u)                             \
  X(uint32, U32, uint32_t, kUnsigned, 0u)                          \
  X(uint64, U64, uint64_t, kUnsigned, 0ull)                        \
  X(uint16, U16, uint16_t, kUnsigned, 0u)                          \
  X(uint8, U8, uint8_t, kUnsigned, 0u)

}  // namespace jax_topk

namespace jax_topk {

enum class DType : int {
#define JAX_TOPK_DTYPE_ENUM(name, ffi, bits, kind, lowest) name,
  JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_ENUM)
#undef JAX_TOPK_DTYPE_ENUM
};

template <DType D>
struct DTypeTraits;

#define JAX_TOPK_DTYPE_TRAITS(name, ffi, bits_type, kind, lowest) \
  template <>                                                     \
  struct DTypeTraits<DType::name> {                               \
    using Bits = bits_type;                                       \
    static constexpr KeyKind kKeyKind = KeyKind::kind;            \
    static constexpr const char* kName = #name;                   \
    static constexpr Bits kLowestBits = Bits(lowest);             \
  };
JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_TRAITS)
#undef JAX_TOPK_DTYPE_TRAITS

// Calls `f(DTypeTraits<D>{})` for the runtime dtype `d`; returns false when `d`
// is not in the table.
template <typename F>
bool visit_dtype(DType d, F&& f) {
  switch (d) {
#define JAX_TOPK_DTYPE_CASE(name, ffi, bits, kind, lowest) \
  case DType::name:                                \
    f(DTypeTraits<DType::name>{});                 \
    return true;
    JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_CASE)
#undef JAX_TOPK_DTYPE_CASE
  }
  return false;
}

// Every dtype of the table has top-k and sort kernels (the dtype column of
// ffi/targets.h; other op families list fewer).
constexpr bool any_dtype(DType) { return true; }

// Bytes of one element (of its storage type).
constexpr int dtype_bytes(DType d) {
  switch (d) {
#define JAX_TOPK_DTYPE_BYTES(name, ffi, bits, kind, lowest) \
  case DType::name:                                          \
    return int(sizeof(bits));
    JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_BYTES)
#undef JAX_TOPK_DTYPE_BYTES
  }
  return 0;
}

}  // namespace jax_topk
