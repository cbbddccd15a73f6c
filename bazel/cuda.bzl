"""nvcc without rules_cuda: .cu files compiled to a static library as CMake does.

CMake (CMakeLists.txt, jax_topk_cuda_kernels): -O3 -std=c++17
--expt-relaxed-constexpr -Xcompiler=-fPIC, one --generate-code per entry of
JAX_TOPK_CUDA_ARCHITECTURES, -DNDEBUG in Release. Here the architectures come
from --define=cuda_archs=LIST (comma-separated, CMake notation: 90 = sm_90 code
and compute_90 PTX, 90-real = code only, 100-virtual = PTX only; sm_90 and
compute_90 are taken too), default DEFAULT_CUDA_ARCHS; -DNDEBUG with -c opt.
Sources listed in wgmma_srcs take 90a for 90 and -DJAX_TOPK_BUILD_HAS_WGMMA=1,
as CMake builds JAX_TOPK_WGMMA_SOURCES.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_config_jax_topk//:defs.bzl", "NVCC")
load(":defs.bzl", "ARCHITECTURE_DEFINES")

DEFAULT_CUDA_ARCHS = "90"

def _archs(ctx):
    """The --define=cuda_archs list, in CMake's notation ("90-real", ...)."""
    raw = ctx.var.get("cuda_archs", DEFAULT_CUDA_ARCHS).replace(";", ",").replace(" ", ",")
    archs = []
    for a in raw.split(","):
        if not a:
            continue
        if a.startswith("sm_"):
            a = a[len("sm_"):] + "-real"
        elif a.startswith("compute_"):
            a = a[len("compute_"):] + "-virtual"
        archs.append(a)
    if not archs:
        fail("--define=cuda_archs is empty")
    return archs

def _wgmma_archs(archs):
    """CMakeLists.txt's rule for JAX_TOPK_WGMMA_SOURCES: 90 becomes 90a (sm_90a, Hopper's wgmma)."""
    return [("90a" + a[len("90"):]) if (a == "90" or a.startswith("90-")) else a for a in archs]

def _gencode(arch):
    if arch.endswith("-real"):
        n = arch[:-len("-real")]
        return "--generate-code=arch=compute_%s,code=[sm_%s]" % (n, n)
    if arch.endswith("-virtual"):
        n = arch[:-len("-virtual")]
        return "--generate-code=arch=compute_%s,code=[compute_%s]" % (n, n)
    return "--generate-code=arch=compute_%s,code=[sm_%s,compute_%s]" % (arch, arch, arch)

def _nvcc_library_impl(ctx):
    if not NVCC:
        fail("jax_topk: no CUDA toolkit was found when @local_config_jax_topk was generated; " +
             "set JAX_TOPK_CUDA_PATH (or put nvcc on PATH) and re-run")
    cc_toolchain = find_cpp_toolchain(ctx)
    root = "/".join([p for p in [ctx.label.workspace_root, ctx.label.package] if p])
    includes = [(root + "/" + i) if root else i for i in ctx.attr.includes]
    archs = _archs(ctx)
    wgmma_archs = _wgmma_archs(archs)
    wgmma_srcs = [f.path for f in ctx.files.wgmma_srcs]
    flags = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC"]
    if ctx.var.get("COMPILATION_MODE") == "opt":
        flags.append("-DNDEBUG")
    flags += ["-I" + (i if i else ".") for i in includes]
    flags += ["-ccbin", cc_toolchain.compiler_executable]
    flags += ctx.attr.copts

    headers = depset(ctx.files.hdrs)
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_nvcc/%s/%s.o" % (ctx.label.name, src.short_path.replace("/", "_")))
        src_archs = wgmma_archs if src.path in wgmma_srcs else archs
        src_flags = [_gencode(a) for a in src_archs]
        if src_archs != archs:
            src_flags.append("-DJAX_TOPK_BUILD_HAS_WGMMA=1")
        ctx.actions.run(
            executable = NVCC,
            arguments = flags + src_flags + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [headers, cc_toolchain.all_files]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s (%s)" % (src.short_path, " ".join(src_archs)),
            use_default_shell_env = True,
        )
        objects.append(obj)

    archive = ctx.actions.declare_file("lib%s.a" % ctx.label.name)
    ctx.actions.run(
        executable = cc_toolchain.ar_executable,
        arguments = ["rcsD", archive.path] + [o.path for o in objects],
        inputs = depset(objects, transitive = [cc_toolchain.all_files]),
        outputs = [archive],
        mnemonic = "NvccArchive",
        progress_message = "Archiving %s" % archive.short_path,
        use_default_shell_env = True,
    )

    # What CMake passes the CUDA FFI module: the architectures, space-separated.
    compilation_context = cc_common.create_compilation_context(
        defines = depset(['%s="%s"' % (d, " ".join(archs)) for d in ARCHITECTURE_DEFINES]),
    )
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    library = cc_common.create_library_to_link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        static_library = archive,
        pic_static_library = archive,
    )
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset([cc_common.create_linker_input(
            owner = ctx.label,
            libraries = depset([library]),
        )]),
    )
    return [
        DefaultInfo(files = depset([archive])),
        CcInfo(compilation_context = compilation_context, linking_context = linking_context),
    ]

nvcc_library = rule(
    implementation = _nvcc_library_impl,
    doc = "Compiles srcs (.cu) with nvcc, one action each, into a static library; " +
          "provides CcInfo (the archive, and JAX_TOPK_GPU_ARCHITECTURES) to cc_* dependents.",
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"], mandatory = True),
        "hdrs": attr.label_list(allow_files = True, doc = "Headers the sources include (action inputs)."),
        "includes": attr.string_list(doc = "Include directories, relative to the package."),
        "copts": attr.string_list(doc = "Extra nvcc flags."),
        "wgmma_srcs": attr.label_list(
            allow_files = [".cu"],
            doc = "Those of srcs with an sm_90a kernel: built for 90a where the list says 90 (CMake's JAX_TOPK_WGMMA_SOURCES).",
        ),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
