"""Checkpoint layout of transformers architectures: run by the ORACLE venv's python.

    python -I weights.py REQUEST.json OUT.json

REQUEST: {"configs": {name: config.json as a dict}}. For each, the model class
transformers maps the config to is instantiated on the meta device (no memory, no
download); its state dict, minus tied duplicates, is put back into the layout checkpoints
on disk use (transformers' own ``revert_weight_conversion``: MoE experts fused in memory
are one tensor per expert on disk). Writes {name: {class, tied, tensors: {name: shape}}}.
Standard library + torch + transformers only; imports nothing from the harness.
"""

import json
import sys
import traceback


def layout(config_dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the in-memory layout is the checkpoint's
        def revert_weight_conversion(_model, state):
            return state

    cfg = dict(config_dict)
    model_type = cfg.pop("model_type")
    for key in ("architectures", "torch_dtype", "dtype"):
        cfg.pop(key, None)
    config = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    every = dict(model.named_parameters(remove_duplicate=False))
    unique = {n for n, _ in model.named_parameters()}
    tied = sorted(n for n in every if n not in unique)
    state = {k: v for k, v in model.state_dict().items() if k not in tied}
    on_disk = revert_weight_conversion(model, state)
    return {"class": type(model).__name__, "tied": tied,
            "tensors": {k: list(v.shape) for k, v in sorted(on_disk.items())}}


def main(argv):
    with open(argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    out = {"ok": False, "models": {}}
    try:
        import transformers

        out["transformers"] = transformers.__version__
        for name, cfg in sorted(req["configs"].items()):
            out["models"][name] = layout(cfg)
        out["ok"] = True
    except BaseException as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, exc)
        out["traceback"] = traceback.format_exc(limit=8)
    tmp = argv[2] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
    import os

    os.replace(tmp, argv[2])
    return 0 if out["ok"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
