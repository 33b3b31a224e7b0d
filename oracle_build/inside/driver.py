"""Capture driver: run by the ORACLE venv's python. Standard library + vLLM only.

    python -I driver.py REQUEST.json RESULT.json
    python -I driver.py --serve FACTS.json KERNEL_CHECK DEVICE ENV_PREFIXES

``--serve`` is the engine host: it first runs the identity probe (probe.py, in this
process, before any engine), writes its facts and waits on stdin for the harness's word:
``run REQUEST.json RESULT.json`` (identity passed: start the engine) or ``exit`` (or end of
input: the harness refused the oracle, or needs no engine). vLLM is imported once for both.

One engine start (in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0), then every run in
the request: each run is a list of generate() calls (batch composition), repeated
``legs`` times. Writes the configuration the engine resolved, read back from the
running engine, never echoed from the request; a value that cannot be read is
recorded as unreadable, with why. vLLM logs to stdout, so results go to a file.
"""

import json
import os
import sys
import time
import traceback

DRIVER_SCHEMA = 2  # 2: top-k rows in ARRAYS_FILE (an .npz), not in the JSON
ARRAYS_FILE = "topk.npz"

# BRIEF section 5's keys, and where each may live on vllm_config (first readable wins).
RESOLVED = {
    "attention_backend": ["attention_config.backend", "model_config.attention_backend"],
    "block_size": ["cache_config.block_size"],
    "cudagraph_capture_sizes": ["compilation_config.cudagraph_capture_sizes"],
    "cudagraph_mode": ["compilation_config.cudagraph_mode"],
    "compilation_mode": ["compilation_config.mode", "compilation_config.level"],
    "dtype": ["model_config.dtype"],
    "enable_chunked_prefill": ["scheduler_config.enable_chunked_prefill"],
    "enable_prefix_caching": ["cache_config.enable_prefix_caching"],
    "enforce_eager": ["model_config.enforce_eager"],
    "gpu_memory_utilization": ["cache_config.gpu_memory_utilization"],
    "kv_cache_dtype": ["cache_config.cache_dtype"],
    "max_model_len": ["model_config.max_model_len"],
    "max_num_batched_tokens": ["scheduler_config.max_num_batched_tokens"],
    "max_num_seqs": ["scheduler_config.max_num_seqs"],
    "moe_backend": ["kernel_config.moe_backend", "model_config.moe_backend"],
    "num_gpu_blocks": ["cache_config.num_gpu_blocks"],
    "num_gpu_blocks_override": ["cache_config.num_gpu_blocks_override"],
    "quantization": ["model_config.quantization"],
    "seed": ["model_config.seed"],
    "tensor_parallel_size": ["parallel_config.tensor_parallel_size"],
    # Beyond the 20: settings that move numerics or size the cache on CPU.
    "kv_cache_memory_bytes": ["cache_config.kv_cache_memory_bytes"],
    "num_cpu_blocks": ["cache_config.num_cpu_blocks"],
    "batch_invariant": ["model_config.batch_invariant"],
    "max_logprobs": ["model_config.max_logprobs"],
    "logprobs_mode": ["model_config.logprobs_mode"],
    "async_scheduling": ["scheduler_config.async_scheduling"],
    "device": ["device_config.device_type", "device_config.device"],
}
# Keys whose config value may be "auto"/None: the engine's real choice is read elsewhere.
CHOSEN_ELSEWHERE = {"attention_backend", "moe_backend"}

MISSING = object()


def jsonable(value, depth=0):
    if depth > 6:
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return repr(value)
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v, depth + 1) for v in items]
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    name = getattr(value, "name", None)
    if name is not None and type(value).__class__.__name__ in ("EnumMeta", "EnumType"):
        return name
    text = str(value)
    return text


def read_path(root, dotted):
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part, MISSING)
        if obj is MISSING:
            return MISSING
    return obj


def resolved_config(vllm_config):
    out = {}
    for key, paths in RESOLVED.items():
        for path in paths:
            value = read_path(vllm_config, path)
            if value is not MISSING:
                out[key] = {"value": jsonable(value), "from": "vllm_config." + path}
                break
        else:
            out[key] = {"unreadable": "no attribute at this vLLM version (tried "
                        + ", ".join("vllm_config." + p for p in paths) + ")"}
    return out


def chosen_backends(vllm_config):
    """The attention/MoE implementations the engine actually instantiated, read from the
    layers registered in the forward context (in-process engine)."""
    out = {"attention": {}, "moe": {}}
    ctx = read_path(vllm_config, "compilation_config.static_forward_context")
    if ctx is MISSING or not isinstance(ctx, dict) or not ctx:
        reason = "compilation_config.static_forward_context is empty or absent"
        return {"attention": {"unreadable": reason}, "moe": {"unreadable": reason}}
    for layer_name, layer in ctx.items():
        backend = getattr(layer, "attn_backend", None)
        if backend is not None:
            get_name = getattr(backend, "get_name", None)
            label = get_name() if callable(get_name) else getattr(backend, "__name__", "?")
            out["attention"].setdefault(label, []).append(layer_name)
            continue
        qm = getattr(layer, "quant_method", None)
        if type(layer).__name__ in ("FusedMoE", "SharedFusedMoE") or "moe" in type(
                layer).__name__.lower():
            label = type(qm).__name__ if qm is not None else type(layer).__name__
            out["moe"].setdefault(label, []).append(layer_name)
    summary = {}
    for kind in ("attention", "moe"):
        found = out[kind]
        if found:
            summary[kind] = {"value": sorted(found), "layers": {k: len(v) for k, v in
                                                                 found.items()}}
        else:
            summary[kind] = {"value": None,
                             "note": "no %s layers in static_forward_context" % kind}
    return summary


def sampling_dict(params):
    fields = getattr(params, "__struct_fields__", None) or [
        f for f in dir(params) if not f.startswith("_") and not callable(getattr(params, f))]
    out = {}
    for f in fields:
        try:
            out[f] = jsonable(getattr(params, f))
        except Exception as exc:
            out[f] = {"unreadable": repr(exc)}
    return out


def topk(position_logprobs, k):
    if position_logprobs is None:
        return None
    items = []
    for token_id, lp in position_logprobs.items():
        rank = getattr(lp, "rank", None)
        items.append((int(token_id), float(lp.logprob), rank if rank is not None else 10 ** 9))
    items.sort(key=lambda t: (-t[1], t[2], t[0]))
    return [[tid, logprob] for tid, logprob, _rank in items]


def topk_arrays(outputs, prefix, arrays):
    """One leg's top-k rows as arrays (oracle_build/topk.py's layout): lengths [P],
    counts [N], ids [N, W] (-1 pad), logprobs [N, W] float64 (NaN pad). The rows leave the
    JSON: parsing millions of small lists costs more than the comparison itself."""
    import numpy as np

    lengths = [len(out["topk"]) for out in outputs]
    rows = [row or [] for out in outputs for row in out.pop("topk")]
    counts = np.array([len(r) for r in rows], dtype=np.uint16)
    width = max(1, int(counts.max()) if len(rows) else 1)
    ids = np.full((len(rows), width), -1, dtype=np.int32)
    lps = np.full((len(rows), width), np.nan, dtype=np.float64)
    for j, row in enumerate(rows):
        if row:
            ids[j, : len(row)] = [t for t, _lp in row]
            lps[j, : len(row)] = [lp for _t, lp in row]
    arrays[prefix + "lengths"] = np.array(lengths, dtype=np.int64)
    arrays[prefix + "counts"] = counts
    arrays[prefix + "ids"] = ids
    arrays[prefix + "logprobs"] = lps


def token_pieces(tokenizer, ids):
    """Each token id as the text it stands for (the report shows pieces, not ids)."""
    out = {}
    for i in sorted(ids)[:200000]:
        try:
            piece = tokenizer.decode([i], skip_special_tokens=False)
            if not piece or "\ufffd" in piece:  # a byte of a longer character: its name
                piece = str(tokenizer.convert_ids_to_tokens(i))
        except Exception:  # noqa: S112 - an id the tokenizer lacks is shown as its id
            continue
        out[str(i)] = piece
    return out


def run_one(llm, SamplingParams, run, legs_out):
    s = dict(run["sampling"])
    params = SamplingParams(**s)
    prompts = []
    for p in run["prompts"]:
        if "token_ids" in p:
            prompts.append({"prompt_token_ids": list(p["token_ids"])})
        else:
            prompts.append({"prompt": p["text"]})
    leg_times = []
    for _leg in range(run["legs"]):
        start = time.monotonic()
        results = [None] * len(prompts)
        for call in run["calls"]:
            outs = llm.generate([prompts[i] for i in call], params, use_tqdm=False)
            for i, out in zip(call, outs):
                comp = out.outputs[0]
                results[i] = {
                    "prompt_token_ids": list(out.prompt_token_ids or []),
                    "token_ids": list(comp.token_ids),
                    "text": comp.text,
                    "finish_reason": comp.finish_reason,
                    "topk": [topk(pos, s.get("logprobs") or 0) for pos in (comp.logprobs or [])],
                }
        leg_times.append(round(time.monotonic() - start, 3))
        legs_out.append(results)
    return sampling_dict(params), leg_times


def audit_weights(audit):
    """Make vLLM's default loader report which checkpoint tensors it consumed: every tensor
    the checkpoint iterator yields is kept; every parameter's weight_loader is wrapped to
    note the storage of each tensor handed to it (slices share their tensor's storage). A
    yielded tensor no loader received was skipped: that part of the model kept its initial
    values, and a golden would test nothing there."""
    import torch
    from vllm.model_executor.model_loader import default_loader
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    loader_cls = default_loader.DefaultModelLoader
    original = loader_cls.load_weights

    def load_weights(self, model, model_config):
        yielded = {}
        consumed = set()
        get_all = self.get_all_weights

        def tracked(mc, m):
            for name, tensor in get_all(mc, m):
                yielded[name] = tensor
                yield name, tensor

        for _pname, param in model.named_parameters():
            inner = getattr(param, "weight_loader", default_weight_loader)

            def wrapped(*args, _inner=inner, **kwargs):
                for value in list(args[1:]) + list(kwargs.values()):
                    if isinstance(value, torch.Tensor) and not isinstance(
                            value, torch.nn.Parameter):
                        consumed.add(value.untyped_storage().data_ptr())
                return _inner(*args, **kwargs)

            param.weight_loader = wrapped
        self.get_all_weights = tracked
        try:
            return original(self, model, model_config)
        finally:
            del self.get_all_weights
            audit["checkpoint_tensors"] = len(yielded)
            audit["unconsumed"] = sorted(
                n for n, t in yielded.items() if t.untyped_storage().data_ptr() not in consumed)
            yielded.clear()

    loader_cls.load_weights = load_weights


_PROBE = []


def probe_module():
    """probe.py beside this script, loaded once (the hold and the kernel facts live there)."""
    if not _PROBE:
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("oracle_probe",
                                                      os.path.join(here, "probe.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _PROBE.append(module)
    return _PROBE[0]


# The compile caches the harness gives the engine (oracle_build/engine/caches.py): each
# variable points below the folder it names, unless the caller set it (the caller's cache).
# TMPDIR always: torch inductor keeps its precompiled headers (about 150 MB each, one per
# compiler command line, the oracle's path in it) and some caches under the temporary
# folder whatever TORCHINDUCTOR_CACHE_DIR says.
COMPILE_CACHE_VARIABLE = "ORACLE_BUILD_INSIDE_COMPILE_CACHE"
COMPILE_CACHES = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("VLLM_CACHE_ROOT", "vllm"),
                  ("TRITON_CACHE_DIR", "triton"), ("TMPDIR", "tmp"))
ALWAYS_SET = ("TMPDIR",)
_SET_HERE = {}


def use_compile_caches():
    """Point the compile caches at the harness's folder, before torch or vLLM is imported
    (and before anything asks for the temporary folder, which Python reads once).
    Called after the environment is recorded: where a cache lives changes no arithmetic,
    and a path in the tool's home would make every golden differ from every other home."""
    root = os.environ.pop(COMPILE_CACHE_VARIABLE, None)
    if not root:
        return
    for name, sub in COMPILE_CACHES:
        if name in ALWAYS_SET or not os.environ.get(name):
            path = os.path.join(root, sub)
            os.makedirs(path, exist_ok=True)  # a TMPDIR that does not exist is passed over
            os.environ[name] = _SET_HERE[name] = path


# What the process reached for on the network (the harness closes it: a network namespace
# with only loopback): every name looked up and every address connected to that is not this
# host's own, from Python's audit events, so that a run that fails for want of the network
# says what it wanted.
REACHED = []
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "")


def _loopback(host):
    if host is None:
        return True
    host = host.decode(errors="replace") if isinstance(host, bytes) else str(host)
    return host in LOOPBACK_NAMES or host.startswith("127.") or host in ("::1", "::") \
        or host == "0.0.0.0"  # noqa: S104 - compared, never bound


def _audit(event, args):
    if len(REACHED) >= 20:
        return
    try:
        if event == "socket.getaddrinfo" and not _loopback(args[0]):
            REACHED.append("%s:%s (name lookup)" % (args[0], args[1]))
        elif event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple) and address and not _loopback(address[0]):
                REACHED.append("%s:%s (connect)" % (address[0], address[1]))
    except Exception:  # noqa: S110 - an audit hook never breaks the engine
        pass


def watch_network():
    if not getattr(watch_network, "on", False):
        sys.addaudithook(_audit)
        watch_network.on = True


def network_facts():
    """The interfaces this process sees (a closed run: only ``lo``) and what it reached for."""
    import socket

    try:
        interfaces = sorted(name for _i, name in socket.if_nameindex())
    except OSError as exc:
        interfaces = ["<unreadable: %s>" % exc]
    return {"interfaces": interfaces, "reached_for": list(REACHED)}


def compiled_kernels():
    """The kernels this engine ran that it compiled at run time: every shared library mapped
    into this process from the compile caches the harness gave it (inductor's kernels, its
    precompiled code), by name and sha256."""
    import hashlib

    roots = [os.path.realpath(v) + "/" for k, v in _SET_HERE.items()]
    if not roots:
        return None
    seen = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].strip()
                real = os.path.realpath(path)
                if path.endswith(" (deleted)") or not any(real.startswith(r) for r in roots):
                    continue
                if real in seen or not os.path.isfile(real):
                    continue
                with open(real, "rb") as so:
                    seen[real] = hashlib.sha256(so.read()).hexdigest()
    except OSError as exc:
        return {"<unreadable>": str(exc)}
    out = {}
    for real, digest in seen.items():
        root = next(r for r in roots if real.startswith(r))
        name = next(k for k, v in _SET_HERE.items() if os.path.realpath(v) + "/" == root)
        out["%s/%s" % (name, real[len(root):])] = digest
    return dict(sorted(out.items()))


def serve(argv):
    """Probe, then wait for the harness: ``run REQ OUT`` or ``exit``."""
    watch_network()
    env_before = dict(os.environ)
    env_before.pop(COMPILE_CACHE_VARIABLE, None)
    use_compile_caches()
    probe = probe_module()
    probe.main([argv[0], *argv[2:]])
    print("driver: identity facts written; waiting for the harness", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 3 or line[0] != "run":
        print("driver: no engine asked for (%s); exiting" % (" ".join(line) or "end of input"),
              flush=True)
        return 0
    return main([argv[0], line[1], line[2]], env_before=env_before)


def main(argv, env_before=None):
    req_path, out_path = argv[1], argv[2]
    with open(req_path, encoding="utf-8") as fh:
        req = json.load(fh)
    result = {"driver_schema": DRIVER_SCHEMA, "ok": False}
    t0 = time.monotonic()
    # The harness names the variables it records (this script imports nothing from it).
    prefixes = tuple(req["record_env_prefixes"])
    before = env_before if env_before is not None else os.environ
    result["env"] = {k: v for k, v in sorted(before.items()) if k.startswith(prefixes)}
    use_compile_caches()
    watch_network()
    try:
        probe = probe_module()
        probe.hold_kernel_variant()  # before vLLM imports its kernels (when held)
        import torch
        import vllm
        from vllm import LLM, SamplingParams

        result["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__}
        result["torch_threads"] = torch.get_num_threads()
        # What vLLM/torch set for themselves on import, apart from what the caller set.
        result["env_after_import"] = {
            k: v for k, v in sorted(os.environ.items())
            if k.startswith(prefixes) and result["env"].get(k) != v
            and _SET_HERE.get(k) != v}
        if req.get("audit_weights"):
            result["weights"] = {}
            audit_weights(result["weights"])
        start = time.monotonic()
        llm = LLM(model=req["model"], **req["engine_args"])
        result["engine_start_seconds"] = round(time.monotonic() - start, 3)
        if req.get("cpu_kernels"):  # the variant in force, read from this process
            result["cpu_kernels"] = probe.cpu_kernels(None)
        vllm_config = llm.llm_engine.vllm_config
        result["resolved"] = resolved_config(vllm_config)
        result["backends"] = chosen_backends(vllm_config)
        result["runs"] = []
        arrays = {}
        wanted = set(req.get("piece_ids") or [])
        for r, run in enumerate(req["runs"]):
            legs = []
            sampling, times = run_one(llm, SamplingParams, run, legs)
            for leg_no, leg in enumerate(legs):
                if req.get("pieces"):
                    for out in leg:
                        wanted.update(out["token_ids"])
                        for row in out["topk"]:
                            wanted.update(t for t, _lp in row or [])
                topk_arrays(leg, "r%d_l%d_" % (r, leg_no), arrays)
            result["runs"].append({"name": run["name"], "sampling": sampling, "legs": legs,
                                   "leg_seconds": times})
        import numpy as np

        arrays_path = os.path.join(os.path.dirname(os.path.abspath(out_path)), ARRAYS_FILE)
        with open(arrays_path + ".tmp", "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(arrays_path + ".tmp", arrays_path)
        result["arrays_file"] = ARRAYS_FILE
        if req.get("pieces"):
            result["pieces"] = token_pieces(llm.get_tokenizer(), wanted)
        # num_gpu_blocks is set once the KV cache is sized: read it again after the runs.
        result["resolved_after"] = resolved_config(vllm_config)
        result["compiled_kernels"] = compiled_kernels()
        result["ok"] = True
    except BaseException as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
        result["traceback"] = traceback.format_exc(limit=20)
    result["network"] = network_facts()
    result["seconds"] = round(time.monotonic() - t0, 3)
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, out_path)
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    sys.exit(serve(sys.argv) if sys.argv[1:2] == ["--serve"] else main(sys.argv))
