#!/usr/bin/env python3
"""Create (or reuse) a cached, CPU-only Python environment for one SGLang release.

The environment is just enough for the engine's own code to import and run on a
machine without a GPU, so a conformance tier can check our rendered commands and
memory arithmetic against the real release:

  * sglang.srt.server_args       (prepare_server_args, ServerArgs, resolution)
  * sglang.srt.environ           (the envs registry)
  * sglang.srt.model_executor.pool_configurator (DSV4PoolConfigurator, ...)
  * sglang.srt.configs.deepseek_v4 / model_config
  * sglang_router.launch_router  (parse_router_args / RouterArgs)

Recipe: an exact, pinned package list per release (sglang and sglang-router without
their dependency trees, PyPI's torch plus the CUDA runtime wheels its shared libraries link
against, and only the pure-Python/CPU packages the imports above actually load), locked with
every wheel's hash in tools/conformance-locks/<version>.txt and installed with `uv pip install
--no-deps --require-hashes` (uv pinned in pyproject's test extras). No GPU kernels packages
(flashinfer, sgl-kernel, deep-gemm, ...) are installed. uv keeps one cache of wheels
(~/.cache/dsv4-operator/uv, or $UV_CACHE_DIR) and links a wheel both releases pin (most of
the CUDA runtime, the pure-Python list) into both environments instead of copying it.

Usage:
    python3 tools/conformance_env.py 0.5.23            # prints the venv's python
    python3 tools/conformance_env.py --list            # known releases
    python3 tools/conformance_env.py 0.5.23 --requirements   # print the pin list
    python3 tools/conformance_env.py 0.5.23 --lock     # rewrite its lock from the pin list

The venv lives at ~/.cache/dsv4-operator/sglang/<version>/venv (override the root with
--cache-root or $DSV4_CONFORMANCE_CACHE). It is reused when its marker file matches the
lock; otherwise it is rebuilt, and says how long that took. A lock file makes concurrent
invocations safe. Standard library only (uv is found beside this interpreter, in the
repository's .venv, on PATH, or given as --uv / $DSV4_UV). Packages come from PyPI; no other
host is used.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any, TypedDict

fcntl: ModuleType | None
try:
    import fcntl  # POSIX only
except ImportError:  # pragma: no cover
    fcntl = None

# --------------------------------------------------------------------------
# Pins. Each release: the Python it needs (the sglang wheels are cp311) and the
# exact list installed with --no-deps. Derived by importing the modules named in
# the docstring in a fresh venv and adding only what they load.
# --------------------------------------------------------------------------

# Shared pure-Python / small-wheel packages the import graph loads in both releases.
_COMMON = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "apache-tvm-ffi==0.1.11",
    "attrs==26.1.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "dill==0.4.1",
    "fastapi==0.165.0",
    "filelock==4.3.1",
    "frozenlist==1.8.0",
    "fsspec==2026.9.0",
    "gguf==0.19.0",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "idna==3.20",
    "ipython==9.18.1",
    "jinja2==3.1.6",
    "loguru==0.7.3",
    "markdown-it-py==4.3.0",
    "markupsafe==3.0.4",
    "mdurl==0.1.2",
    "mpmath==1.3.0",
    "msgspec==0.23.0",
    "multidict==7.2.1",
    "networkx==3.6.1",
    "numpy==2.4.6",
    "opentelemetry-api==1.45.2",
    "orjson==3.13.0",
    "packaging==26.4",
    "pillow==13.0.0",
    "prometheus-client==0.26.0",
    "propcache==0.5.4",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pygments==2.21.0",
    "pyzmq==27.3.0",
    "regex==2026.11.19",
    "requests==2.34.2",
    "rich==15.0.0",
    "safetensors==0.8.0",
    "setproctitle==1.3.8",
    "shellingham==1.5.4",
    "starlette==1.10.0",
    "sympy==1.14.0",
    "tqdm==4.70.1",
    "traitlets==5.16.1",
    "typer==0.29.2",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "urllib3==2.8.0",
    "uvicorn==0.54.0",
    "yarl==1.25.1",
]

# CUDA runtime wheels: PyPI's Linux torch links libtorch_cuda.so against these
# sonames (libcudart, libcublas(Lt), libcusparse(Lt), libcufft, libcufile,
# libcurand, libnccl, libcudnn, libnvrtc, nvshmem), so `import torch` fails
# without them even though no GPU is ever used. Versions are the ones torch's
# own metadata pins (cuda-toolkit[...] extras).
# The CUDA 13.0 runtime wheels both torch builds pin identically.
_CUDA_13_0_SHARED = [
    "nvidia-cuda-cupti==13.0.85",
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cufft==12.0.0.61",
    "nvidia-cufile==1.15.1.6",
    "nvidia-curand==10.4.0.35",
    "nvidia-cusolver==12.0.4.66",
    "nvidia-cusparse==12.6.3.3",
]
_CUDA_13_0_3 = [
    "cuda-toolkit==13.0.3",
    "nvidia-cublas==13.1.1.3",
    *_CUDA_13_0_SHARED,
    "nvidia-nvjitlink==13.5.37",
    "nvidia-nvtx==13.0.85",
]
_CUDA_13_0_2 = [
    "cuda-toolkit==13.0.2",
    "nvidia-cublas==13.1.0.3",
    *_CUDA_13_0_SHARED,
    "nvidia-nvjitlink==13.0.88",
    "nvidia-nvtx==13.0.85",
]


class Release(TypedDict):
    python: tuple[int, int]  # the interpreter the wheels are built for
    router: str  # the sglang-router release beside it
    requirements: list[str]  # installed with --no-deps


RELEASES: dict[str, Release] = {
    "0.5.23": {
        "python": (3, 11),
        "router": "0.3.2",
        "requirements": [
            "sglang==0.5.23",
            "torch==2.14.1",
            "torchvision==0.29.2",
            "triton==3.8.0",
            *_CUDA_13_0_3,
            "nvidia-cudnn-cu13==9.24.0.43",
            "nvidia-cusparselt-cu13==0.8.1",
            "nvidia-nccl-cu13==2.30.7",
            "nvidia-nvshmem-cu13==3.4.5",
            *_COMMON,
            "compressed-tensors==0.18.0",
            # deepseek-recipe parses DeepSeek-V4 chat output (sglang/srt/parser); openai's
            # types, the HTTP client it imports and partial-json-parser are what the tool-call
            # parsers import (tests/conformance/test_patches.py, toolCallDropCounter)
            "deepseek-recipe==0.2.0",
            "distro==1.9.0",
            "httpcore==1.0.9",
            "httpcore2==2.16.2",
            "httpx==0.28.1",
            "httpx2==2.16.2",
            "huggingface-hub==2.4.0",
            "openai==2.8.0",
            "partial-json-parser==0.2.1.1.post7",
            "pyyaml==6.0.4",
            "sentencepiece==0.2.1",
            "sniffio==1.3.1",
            "tokenizers==0.23.2",
            "transformers==5.19.0",
            "truststore==0.10.5",
        ],
    },
    "0.5.16": {
        "python": (3, 11),
        "router": "0.3.2",
        "requirements": [
            "sglang==0.5.16",
            "torch==2.11.0",
            "torchvision==0.26.0",
            "triton==3.6.0",
            "cuda-bindings==13.5.0",
            "cuda-pathfinder==1.9.1",
            *_CUDA_13_0_2,
            "nvidia-cudnn-cu13==9.19.0.56",
            "nvidia-cusparselt-cu13==0.8.0",
            "nvidia-nccl-cu13==2.28.9",
            "nvidia-nvshmem-cu13==3.4.5",
            *_COMMON,
            "compressed-tensors==0.20.1",
            "distro==1.9.0",
            "einops==0.8.2",
            "httpcore==1.0.9",
            "httpx==0.28.1",
            "huggingface-hub==1.33.0",
            "openai==2.6.1",
            "partial-json-parser==0.2.1.1.post7",
            "pyyaml==6.0.4",
            "sentencepiece==0.2.3",
            "sniffio==1.3.1",
            "tokenizers==0.22.2",
            "transformers==5.12.1",
            "xgrammar==0.2.1",
            # torch 2.11's cpp_extension (imported by sglang 0.5.16) imports setuptools; a
            # venv made by Python 3.11's own venv module carries this one, uv's carries none.
            "setuptools==65.5.0",
        ],
    },
}

SMOKE_IMPORTS = [
    "sglang.srt.environ",
    "sglang.srt.server_args",
    "sglang.srt.configs.deepseek_v4",
    "sglang.srt.model_executor.pool_configurator",
    "sglang.srt.function_call.deepseekv4_detector",
    "prometheus_client",
    "sglang_router.launch_router",
]

MARKER = ".dsv4-conformance.json"
HERE = os.path.dirname(os.path.abspath(__file__))
LOCK_DIR = os.path.join(HERE, "conformance-locks")
UV_VERSION = "0.13.8"  # pyproject.toml's test extras pin the same
# The platform the sglang wheels are published for (manylinux_2_34, x86_64; glibc >= 2.34).
LOCK_PLATFORM = "x86_64-manylinux_2_34"


def requirement_list(version: str) -> list[str]:
    rel = RELEASES[version]
    return [*rel["requirements"], f"sglang-router=={rel['router']}"]


def lock_path(version: str) -> str:
    return os.path.join(LOCK_DIR, f"{version}.txt")


def normalised(pin: str) -> str:
    """`Name_x==13.0.3.0` -> `name-x==13.0.3`: PEP 503 names, PEP 440's trailing zeros."""
    name, _, version = pin.partition("==")
    parts = version.split(".")
    while len(parts) > 1 and parts[-1] == "0":
        parts.pop()
    return f"{name.strip().lower().replace('_', '-')}=={'.'.join(parts)}"


def locked_pins(lock_text: str) -> list[str]:
    """The `name==version` lines of a lock (its hash lines dropped), normalised."""
    pins = []
    for line in lock_text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "--")):
            pins.append(normalised(line.rstrip("\\ ")))
    return sorted(pins)


def read_lock(version: str) -> str:
    """The release's lock, refused when it no longer pins exactly the release's list."""
    try:
        with open(lock_path(version)) as fh:
            text = fh.read()
    except OSError as error:
        raise SystemExit(
            f"conformance_env: no lock for sglang {version} ({error.strerror}): run "
            f"python3 tools/conformance_env.py {version} --lock"
        ) from error
    want = sorted(normalised(r) for r in requirement_list(version))
    if locked_pins(text) != want:
        raise SystemExit(
            f"conformance_env: {lock_path(version)} does not pin RELEASES[{version!r}] exactly: "
            f"run python3 tools/conformance_env.py {version} --lock"
        )
    return text


def marker_payload(version: str, lock_text: str, py: tuple[int, int]) -> dict[str, Any]:
    return {
        "sglang": version,
        "python": f"{py[0]}.{py[1]}",
        "lock_sha256": hashlib.sha256(lock_text.encode()).hexdigest(),
        "smoke_imports": SMOKE_IMPORTS,
    }


def find_uv(explicit: str | None) -> str:
    """uv: --uv / $DSV4_UV, else beside this interpreter, the repository's .venv, PATH."""
    candidates = [
        explicit or os.environ.get("DSV4_UV"),
        os.path.join(os.path.dirname(sys.executable), "uv"),
        os.path.join(os.path.dirname(HERE), ".venv", "bin", "uv"),
        shutil.which("uv"),
    ]
    for cand in candidates:
        if cand and os.access(cand, os.X_OK):
            return cand
    raise SystemExit(
        f"conformance_env: uv not found; `make install` puts uv=={UV_VERSION} into .venv "
        f"(or: pip install uv=={UV_VERSION}, or pass --uv)"
    )


def uv_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault(
        "UV_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "dsv4-operator", "uv")
    )
    # Only the configured index: a stray local wheel directory must not satisfy a pin.
    env.pop("PIP_FIND_LINKS", None)
    env.pop("UV_FIND_LINKS", None)
    return env


def write_lock(version: str, uv: str) -> str:
    """Resolve the release's pins (no dependencies: the list is complete) with every wheel's
    hash into its lock file."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    source = os.path.join(LOCK_DIR, f".{version}.in")
    with open(source, "w") as fh:
        fh.write("\n".join(requirement_list(version)) + "\n")
    py = RELEASES[version]["python"]
    try:
        subprocess.run(
            [
                uv, "pip", "compile", "--quiet", "--no-deps", "--generate-hashes",
                "--no-header", "--no-annotate", "--only-binary", ":all:",
                "--python-version", f"{py[0]}.{py[1]}", "--python-platform", LOCK_PLATFORM,
                "--output-file", lock_path(version), source,
            ],
            check=True,
            env=uv_env(),
        )  # fmt: skip
    finally:
        os.remove(source)
    with open(lock_path(version)) as fh:
        text = fh.read()
    header = (
        f"# sglang {version}: RELEASES[{version!r}] in tools/conformance_env.py, locked with\n"
        f"# every wheel's hash by `python3 tools/conformance_env.py {version} --lock`.\n"
    )
    with open(lock_path(version), "w") as fh:
        fh.write(header + text)
    return lock_path(version)


def find_python(want: tuple[int, int], explicit: str | None) -> str:
    candidates = (
        [explicit]
        if explicit
        else [
            sys.executable,
            f"python{want[0]}.{want[1]}",
            "python3",
        ]
    )
    for cand in candidates:
        if not cand:
            continue
        path = cand if os.path.sep in cand else shutil.which(cand)
        if not path:
            continue
        try:
            out = subprocess.run(
                [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
        if out == f"{want[0]}.{want[1]}":
            return path
    raise SystemExit(
        f"conformance_env: need Python {want[0]}.{want[1]} (the sglang wheels are "
        f"cp{want[0]}{want[1]}); pass --python"
    )


def log(msg: str) -> None:
    print("conformance_env: " + msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh, fcntl.LOCK_UN)


def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def read_marker(venv: str) -> Any:
    return _read_json(os.path.join(venv, MARKER))


def smoke(py: str) -> None:
    code = "import warnings; warnings.simplefilter('ignore')\n" + "\n".join(
        f"import {m}" for m in SMOKE_IMPORTS
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"conformance_env: smoke import failed in {py}:\n{r.stderr[-4000:]}")


BYTECODE_STAMP = ".dsv4-bytecode"


def compile_bytecode(venv: str, want: dict[str, Any]) -> None:
    """Compile the venv's modules once (stamped with the marker): without .pyc files every
    import of torch and sglang compiles thousands of modules anew (about ten CPU seconds), and
    with PYTHONDONTWRITEBYTECODE set Python never writes them itself. A module that does not
    compile only stays uncompiled."""
    stamp = os.path.join(venv, BYTECODE_STAMP)
    if read_marker(venv) == want and _read_json(stamp) == want:
        return
    py = venv_python(venv)
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    t0 = time.monotonic()
    subprocess.run([py, "-m", "compileall", "-q", "-j", "0", site], capture_output=True)
    with open(stamp, "w") as fh:
        json.dump(want, fh, indent=1)
    log(f"compiled {site} in {time.monotonic() - t0:.0f} s")


def _read_json(path: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def build(venv: str, base_python: str, version: str, uv: str) -> None:
    if os.path.exists(venv):
        shutil.rmtree(venv)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    env = uv_env()
    subprocess.run([uv, "venv", "--quiet", "--python", base_python, venv], check=True, env=env)
    cmd = [
        uv, "pip", "install", "--python", venv_python(venv), "--no-deps", "--require-hashes",
        "--only-binary", ":all:", "-r", lock_path(version),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)


def ensure(version: str, cache_root: str, python: str | None, uv: str | None, force: bool) -> str:
    rel = RELEASES[version]
    lock_text = read_lock(version)
    want = marker_payload(version, lock_text, rel["python"])
    venv = os.path.join(cache_root, version, "venv")
    with locked(os.path.join(cache_root, version, ".lock")):
        if not force and read_marker(venv) == want and os.path.exists(venv_python(venv)):
            compile_bytecode(venv, want)
            return venv_python(venv)
        base = find_python(rel["python"], python)
        uv_path = find_uv(uv)
        log(f"building {venv} (sglang {version}, {len(locked_pins(lock_text))} locked packages)")
        t0 = time.monotonic()
        marker = os.path.join(venv, MARKER)
        if os.path.exists(marker):
            os.remove(marker)
        build(venv, base, version, uv_path)
        smoke(venv_python(venv))
        with open(marker, "w") as fh:
            json.dump(want, fh, indent=1)
        compile_bytecode(venv, want)
        log(f"sglang {version} ready in {time.monotonic() - t0:.0f} s")
    return venv_python(venv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version", nargs="?", help="sglang release, e.g. 0.5.23")
    ap.add_argument(
        "--cache-root",
        default=os.environ.get(
            "DSV4_CONFORMANCE_CACHE",
            os.path.join(os.path.expanduser("~"), ".cache", "dsv4-operator", "sglang"),
        ),
    )
    ap.add_argument("--python", help="base interpreter (must match the release's Python)")
    ap.add_argument("--uv", help=f"the uv executable (uv=={UV_VERSION})")
    ap.add_argument("--force", action="store_true", help="rebuild even if the marker matches")
    ap.add_argument("--list", action="store_true", help="print known releases")
    ap.add_argument("--requirements", action="store_true", help="print the pin list and exit")
    ap.add_argument("--lock", action="store_true", help="rewrite the release's lock and exit")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 0 and print the python if the cached venv is ready, else exit 1 (no build)",
    )
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(sorted(RELEASES)))
        return 0
    if not args.version:
        ap.error("version is required")
    if args.version not in RELEASES:
        ap.error("unknown release {} (known: {})".format(args.version, ", ".join(sorted(RELEASES))))
    if args.requirements:
        print("\n".join(requirement_list(args.version)))
        return 0
    if args.lock:
        print(write_lock(args.version, find_uv(args.uv)))
        return 0
    if args.check:
        rel = RELEASES[args.version]
        venv = os.path.join(args.cache_root, args.version, "venv")
        want = marker_payload(args.version, read_lock(args.version), rel["python"])
        if read_marker(venv) == want and os.path.exists(venv_python(venv)):
            print(venv_python(venv))
            return 0
        return 1
    print(ensure(args.version, args.cache_root, args.python, args.uv, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
