"""jax_topk_ffi_module: one platform's nanobind FFI module, as CMake's
jax_topk_add_ffi_module (nanobind_add_module NB_STATIC) builds it."""

load("@local_config_jax_topk//:defs.bzl", "COMPILER", "EXT_SUFFIX", "JAXLIB_VERSION")

# The module's own code, as nanobind_add_module compiles it in Release.
_MODULE_COPTS = [
    "-std=c++17",
    "-Os",
    "-fvisibility=hidden",
    "-fno-stack-protector",
    "-ffunction-sections",
    "-fdata-sections",
]

# module.cc reads the kernels' architectures as JAX_TOPK_GPU_ARCHITECTURES
# (build_info "gpu_architectures").
ARCHITECTURE_DEFINES = ["JAX_TOPK_GPU_ARCHITECTURES"]

def jax_topk_ffi_module(name, platform, srcs, hdrs = [], deps = [], architectures = None, **kwargs):
    """`name` (an alias) for jax_topk/<name><EXT_SUFFIX>, the file Python imports.

    Args:
      name: module name, _jax_topk_cpu or _jax_topk_cuda (JAX_TOPK_MODULE_NAME).
      platform: CPU or CUDA (JAX_TOPK_PLATFORM_<platform>=1).
      srcs, hdrs: the FFI handlers (ffi/*.cc, ffi/*.h).
      deps: the platform's kernels.
      architectures: what the kernels were built for ("none" for CPU); None
        when a dep defines it (nvcc_library does, from --define=cuda_archs).
      **kwargs: target_compatible_with, visibility, tags (both targets).
    """
    so = "jax_topk/%s%s" % (name, EXT_SUFFIX)
    native.cc_binary(
        name = so,
        srcs = srcs + hdrs,
        copts = _MODULE_COPTS,
        # Bourne-tokenised: the escaped quotes make string literals, as CMake's.
        local_defines = [
            "JAX_TOPK_PLATFORM_%s=1" % platform,
            "JAX_TOPK_MODULE_NAME=%s" % name,
            'JAX_TOPK_FFI_JAXLIB_VERSION=\\"%s\\"' % JAXLIB_VERSION,
            'JAX_TOPK_COMPILER=\\"%s\\"' % COMPILER,
        ] + ([
            '%s=\\"%s\\"' % (d, architectures)
            for d in ARCHITECTURE_DEFINES
        ] if architectures != None else []),
        linkopts = ["-Wl,--gc-sections"],
        linkshared = True,
        deps = deps + [
            "@local_config_jax_topk//:nanobind",
            "@local_config_jax_topk//:xla_ffi_headers",
        ],
        **kwargs
    )
    native.alias(
        name = name,
        actual = ":" + so,
        visibility = kwargs.get("visibility"),
        tags = kwargs.get("tags"),
    )
