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

// X(numpy_name, XLA_FFI_DataType suffix, storage type, key kind)
#define JAX_TOPK_FOR_EACH_DTYPE(X)             \
  X(float32, F32, uint32_t, kFloat)            \
  X(bfloat16, BF16, uint16_t, kFloat)          \
  X(float16, F16, uint16_t, kFloat)            \
  X(float64, F64, uint64_t, kFloat)            \
  X(int32, S32, uint32_t, kSigned)             \
  X(int64, S64, uint64_t, kSigned)             \
  X(int16, S16, uint16_t, kSigned)             \
  X(int8, S8, uint8_t, kSigned)                \
  X(uint32, U32, uint32_t, kUnsigned)          \
  X(uint64, U64, uint64_t, kUnsigned)          \
  X(uint16, U16, uint16_t, kUnsigned)          \
  X(uint8, U8, uint8_t, kUnsigned)

}  // namespace jax_topk

namespace jax_topk {

enum class DType : int {
#define JAX_TOPK_DTYPE_ENUM(name, ffi, bits, kind) name,
  JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_ENUM)
#undef JAX_TOPK_DTYPE_ENUM
};

template <DType D>
struct DTypeTraits;

#define JAX_TOPK_DTYPE_TRAITS(name, ffi, bits_type, kind)  \
  template <>                                              \
  struct DTypeTraits<DType::name> {                        \
    using Bits = bits_type;                                \
    static constexpr KeyKind kKeyKind = KeyKind::kind;     \
    static constexpr const char* kName = #name;            \
  };
JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_TRAITS)
#undef JAX_TOPK_DTYPE_TRAITS

// Calls `f(DTypeTraits<D>{})` for the runtime dtype `d`; returns false when `d`
// is not in the table.
template <typename F>
bool visit_dtype(DType d, F&& f) {
  switch (d) {
#define JAX_TOPK_DTYPE_CASE(name, ffi, bits, kind) \
  case DType::name:                                \
    f(DTypeTraits<DType::name>{});                 \
    return true;
    JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_DTYPE_CASE)
#undef JAX_TOPK_DTYPE_CASE
  }
  return false;
}

}  // namespace jax_topk
