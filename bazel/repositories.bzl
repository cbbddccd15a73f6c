"""Repository rules of the jax_topk Bazel build (Bazel 4.2+, WORKSPACE mode).

jax_topk_local_config: runs the configured Python (JAX_TOPK_PYTHON, default
`python3`) to find its headers, nanobind (sources and headers, compiled here)
and jaxlib's XLA FFI headers, exactly as CMakeLists.txt does; and finds a CUDA
toolkit (JAX_TOPK_CUDA_PATH, CUDA_PATH, CUDA_HOME, nvcc on PATH, or
/usr/local/cuda). Nothing machine-specific is committed: it all lands in
@local_config_jax_topk, generated at fetch time.

jax_topk_offline_rules: Bazel 4's own cc and java toolchain BUILD files load
@rules_cc and @rules_java, which it would otherwise download. Where they are
not declared already, these stand-ins re-export the native rules, so a build
needs no network (Debian's bazel-bootstrap, air-gapped CI).
"""

_ENV = [
    "JAX_TOPK_PYTHON",
    "JAX_TOPK_FFI_INCLUDE_DIR",
    "JAX_TOPK_CUDA_PATH",
    "CUDA_PATH",
    "CUDA_HOME",
    "CC",
    "PATH",
]

# Prints key=value lines; runs under the configured interpreter.
_PROBE = """
import os, sys, sysconfig
def out(k, v): print("%s=%s" % (k, v))
out("python", sys.executable)
out("python_version", "%d.%d" % sys.version_info[:2])
out("python_include", sysconfig.get_paths()["include"])
out("ext_suffix", sysconfig.get_config_var("EXT_SUFFIX"))
try:
    import nanobind
    out("nanobind_dir", os.path.dirname(os.path.abspath(nanobind.__file__)))
    out("nanobind_version", nanobind.__version__)
except ImportError as e:
    out("nanobind_error", e)
try:
    import jaxlib
    out("jaxlib_include", os.path.join(os.path.dirname(os.path.abspath(jaxlib.__file__)), "include"))
    out("jaxlib_version", jaxlib.__version__)
except ImportError as e:
    out("jaxlib_error", e)
"""

def _run(rctx, args, what):
    r = rctx.execute(args, quiet = True)
    if r.return_code != 0:
        fail("jax_topk: %s failed (%s):\n%s%s" % (what, " ".join([str(a) for a in args]), r.stdout, r.stderr))
    return r.stdout

def _probe_python(rctx):
    python = rctx.os.environ.get("JAX_TOPK_PYTHON", "python3")
    if "/" not in python:
        found = rctx.which(python)
        if not found:
            fail("jax_topk: Python interpreter '%s' not found on PATH; set JAX_TOPK_PYTHON" % python)
        python = str(found)
    info = {}
    for line in _run(rctx, [python, "-c", _PROBE], "probing " + python).splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            info[k] = v.strip()
    major, minor = [int(p) for p in info["python_version"].split(".")]
    if (major, minor) < (3, 10):
        fail("jax_topk: Python >= 3.10 needed, %s is %s" % (python, info["python_version"]))
    if "nanobind_error" in info:
        fail("jax_topk: nanobind is not importable by %s (%s): `%s -m pip install nanobind`" %
             (python, info["nanobind_error"], python))
    ffi = rctx.os.environ.get("JAX_TOPK_FFI_INCLUDE_DIR", "")
    if "jaxlib_error" in info:
        fail("jax_topk: jaxlib is not importable by %s (%s); the XLA FFI headers and their version come from it" %
             (python, info["jaxlib_error"]))
    if ffi:
        info["jaxlib_include"] = ffi
    if not rctx.path(info["jaxlib_include"] + "/xla/ffi/api/ffi.h").exists:
        fail("jax_topk: no xla/ffi/api/ffi.h under %s" % info["jaxlib_include"])
    return info

def _compiler_id(rctx):
    """CMAKE_CXX_COMPILER_ID-CMAKE_CXX_COMPILER_VERSION of the compiler Bazel's
    auto-configured toolchain uses ($CC, else gcc), e.g. GNU-12.2.0."""
    cc = rctx.os.environ.get("CC", "gcc")
    path = cc if "/" in cc else rctx.which(cc)
    if not path:
        return "unknown"
    r = rctx.execute([path, "--version"], quiet = True)
    family = "Clang" if "clang" in r.stdout.lower() else "GNU"
    r = rctx.execute([path, "-dumpfullversion", "-dumpversion"], quiet = True)
    version = r.stdout.strip() if r.return_code == 0 else "unknown"
    return "%s-%s" % (family, version)

def _is_cuda_toolkit(rctx, path):
    return bool(path) and rctx.path(path + "/bin/nvcc").exists and \
           rctx.path(path + "/include/cuda_runtime_api.h").exists

def _find_cuda(rctx):
    """The CUDA toolkit's root: from the environment, else that of the nvcc on
    PATH (asked, as it may be a wrapper script), else /usr/local/cuda."""
    for var in ["JAX_TOPK_CUDA_PATH", "CUDA_PATH", "CUDA_HOME"]:
        p = rctx.os.environ.get(var, "")
        if _is_cuda_toolkit(rctx, p):
            return p
    nvcc = rctx.which("nvcc")
    if nvcc:
        r = rctx.execute([nvcc, "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], quiet = True)
        for line in (r.stdout + r.stderr).splitlines():
            if line.startswith("#$ _HERE_="):
                p = str(rctx.path(line[len("#$ _HERE_="):].strip()).dirname)
                if _is_cuda_toolkit(rctx, p):
                    return p
        p = str(nvcc.dirname.dirname)
        if _is_cuda_toolkit(rctx, p):
            return p
    if _is_cuda_toolkit(rctx, "/usr/local/cuda"):
        return "/usr/local/cuda"
    return ""

_BUILD_HEAD = """# Generated by //bazel:repositories.bzl (jax_topk_local_config); do not edit.
package(default_visibility = ["//visibility:public"])

config_setting(
    name = "opt",
    values = {"compilation_mode": "opt"},
)

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "xla_ffi_headers",
    hdrs = glob(["jaxlib_include/xla/ffi/api/*.h"]),
    includes = ["jaxlib_include"],
)

cc_library(
    name = "robin_map",
    hdrs = glob(["nanobind/ext/robin_map/include/**/*.h"]),
    includes = ["nanobind/ext/robin_map/include"],
    visibility = ["//visibility:private"],
)

# libnanobind, static, as nanobind_add_module(NB_STATIC) builds it: the one
# translation unit nanobind ships for build systems other than CMake.
cc_library(
    name = "nanobind",
    srcs = ["nanobind/src/nb_combined.cpp"] + glob(["nanobind/src/*.h"]),
    hdrs = glob(["nanobind/include/**/*.h"]),
    textual_hdrs = glob(["nanobind/src/*.cpp"], exclude = ["nanobind/src/nb_combined.cpp"]),
    copts = [
        "-std=c++17",
        "-O3",
        "-fvisibility=hidden",
        "-fno-strict-aliasing",
        "-ffunction-sections",
        "-fdata-sections",
        "-fno-stack-protector",
        "-w",
    ],
    includes = ["nanobind/include"],
    linkstatic = True,
    local_defines = ["NB_BUILD"] + select({
        ":opt": ["NB_COMPACT_ASSERTIONS"],
        "//conditions:default": [],
    }),
    deps = [
        ":python_headers",
        ":robin_map",
    ],
)
"""

_BUILD_CUDA = """
# The CUDA toolkit at %s: headers for the host code of the CUDA FFI
# module, and the static runtime (CUDA::cudart_static in CMake).
cc_library(
    name = "cuda_headers",
    hdrs = glob(["cuda/include/**"]),
    includes = ["cuda/include"],
)

cc_import(
    name = "cudart_static_archive",
    static_library = "cuda/lib/libcudart_static.a",
)

cc_library(
    name = "cudart_static",
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers", ":cudart_static_archive"],
)
"""

_BUILD_NO_CUDA = """
# No CUDA toolkit was found (JAX_TOPK_CUDA_PATH, CUDA_PATH, CUDA_HOME, nvcc on
# PATH, /usr/local/cuda): building a CUDA target fails here, with this message.
genrule(
    name = "no_cuda",
    outs = ["no_cuda.h"],
    cmd = "echo 'jax_topk: no CUDA toolkit found; set JAX_TOPK_CUDA_PATH and re-run' >&2; exit 1",
)

cc_library(name = "cuda_headers", hdrs = [":no_cuda"])

cc_library(name = "cudart_static", deps = [":cuda_headers"])
"""

def _local_config_impl(rctx):
    info = _probe_python(rctx)
    rctx.symlink(info["python_include"], "python_include")
    rctx.symlink(info["nanobind_dir"], "nanobind")
    rctx.symlink(info["jaxlib_include"], "jaxlib_include")

    cuda = _find_cuda(rctx)
    build = _BUILD_HEAD
    if cuda:
        rctx.symlink(cuda + "/include", "cuda/include")
        for lib in ["lib64", "lib", "targets/x86_64-linux/lib"]:
            if rctx.path(cuda + "/" + lib + "/libcudart_static.a").exists:
                rctx.symlink(cuda + "/" + lib + "/libcudart_static.a", "cuda/lib/libcudart_static.a")
                break
        build += _BUILD_CUDA % cuda
    else:
        build += _BUILD_NO_CUDA
    rctx.file("BUILD", build)

    rctx.file("defs.bzl", "\n".join([
        "# Generated by //bazel:repositories.bzl (jax_topk_local_config); do not edit.",
        "PYTHON = %r" % info["python"],
        "PYTHON_VERSION = %r" % info["python_version"],
        "EXT_SUFFIX = %r" % info["ext_suffix"],
        "NANOBIND_VERSION = %r" % info["nanobind_version"],
        "JAXLIB_VERSION = %r" % info["jaxlib_version"],
        "FFI_INCLUDE_DIR = %r" % info["jaxlib_include"],
        "COMPILER = %r" % _compiler_id(rctx),
        "CUDA_PATH = %r" % cuda,
        "NVCC = %r" % ((cuda + "/bin/nvcc") if cuda else ""),
        "",
    ]))

jax_topk_local_config = repository_rule(
    implementation = _local_config_impl,
    environ = _ENV,
    local = True,
    doc = "Python headers, nanobind, jaxlib's XLA FFI headers and the CUDA toolkit of this machine.",
)

def _native_rules_impl(rctx):
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("BUILD", "")
    rctx.file("%s/BUILD" % rctx.attr.package, 'exports_files(["defs.bzl"])\n')
    rctx.file("%s/defs.bzl" % rctx.attr.package, "".join([
        "%s = getattr(native, %r)\n" % (r, r)
        for r in rctx.attr.rules
    ]))

_native_rules = repository_rule(
    implementation = _native_rules_impl,
    attrs = {
        "package": attr.string(mandatory = True),
        "rules": attr.string_list(mandatory = True),
    },
)

def jax_topk_offline_rules():
    """@rules_cc and @rules_java as re-exports of Bazel's native rules, unless
    the workspace declares them itself (call this after doing so)."""
    existing = native.existing_rules()
    if "rules_cc" not in existing:
        _native_rules(
            name = "rules_cc",
            package = "cc",
            rules = ["cc_binary", "cc_import", "cc_library", "cc_proto_library", "cc_test",
                     "cc_toolchain", "cc_toolchain_suite", "objc_library"],
        )
    if "rules_java" not in existing:
        _native_rules(
            name = "rules_java",
            package = "java",
            rules = ["java_binary", "java_import", "java_library", "java_plugin",
                     "java_proto_library", "java_runtime", "java_test", "java_toolchain"],
        )
