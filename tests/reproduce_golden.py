#!/usr/bin/env python3
"""Reproduce a golden with plain vLLM, from the golden's own fields: what a third party does
without oracle-build (docs/capture-and-verify.md, "reproducing a golden without
oracle-build"). It imports nothing of oracle_build; it needs only the Python of an
environment with the golden's vLLM (``oracle.identity.vllm``, ``.torch``) installed.

    python reproduce_golden.py GOLDEN_JSON MODEL_DIR

GOLDEN_JSON: a golden.json (its top-k sidecar beside it). MODEL_DIR: the model's files,
each checked against the golden's ``model.files`` sha256 first. Exit 0 when every token and
every recorded top-k id and logprob is the golden's, bit for bit; 1 when any differs (the
first differences printed); 2 when the golden or the model cannot be used (said why).

A golden is someone else's file. The script refuses (exit 2, naming the field) a golden
whose ``environment`` or ``engine.kernel_variant.env`` sets a variable it does not take: the
kernel variant's variables only by name (HOLD_VARIABLES), each value a plain setting; the
recorded ``environment`` only plain settings (no loader, Python or path variable, no value
with a path or a control character); a golden with nothing to reproduce (no prompt, no
generate() call, no token); a prompt id or a token that is not one. Whatever it prints of
the golden is escaped, and its verdict line is printed only once it compared every token.

The steps, each from one field of the golden:
1. a process whose environment holds only PATH, HOME, the locale, and the golden's
   ``environment`` plus its kernel variant's variables (``engine.kernel_variant.env``),
   as checked above;
2. before vLLM is imported, torch.cpu's predicates answer as ``engine.kernel_variant
   .predicates`` says (vLLM chooses its kernel library and kernels by them);
3. ``LLM(model=MODEL_DIR, **engine.requested)``;
4. ``SamplingParams(**spec.sampling, logprobs=logprobs)`` (no seed when it is null);
5. each call of ``batch.calls`` one ``generate()`` of those prompts (the spec's text, or
   the recorded prompt token ids when the spec gave ids), in order;
6. each position's top-k as vLLM returns it, best first (ties by rank, then token id),
   against the golden's table.
"""

import hashlib
import json
import os
import re
import sys

CHILD = "REPRODUCE_GOLDEN_CHILD"
KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
# what a kernel-variant hold sets (oracle_build/core/env.py CPU_NUMERICS; a test keeps the two
# lists equal), each value a plain word
HOLD_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR",
                  "MKL_ENABLE_INSTRUCTIONS")
HOLD_VALUE = re.compile(r"^[A-Za-z0-9_,.]{1,64}$")
# a recorded variable the child may take: a plain name, never one that loads code or
# libraries or moves where Python, the loader or a cache looks
NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
NEVER = ("LD_", "PYTHON", "ORACLE_BUILD_")
NEVER_WORDS = ("PATH", "DIR", "ROOT", "HOME", "FILE", "CONFIG", "PLUGIN", "CACHE", "MODULE",
               "LIB", "PRELOAD", "SCRIPT", "HOOK", "CMD", "COMMAND", "EXEC", "URL", "HOST",
               "PORT", "ENDPOINT", "PROXY", "TOKEN", "KEY", "SECRET")
PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_,.:=+ -]{0,256}$")
PROMPT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def shown(value, limit=200):
    """Outside text as printed: escaped (a newline or an escape cannot start a line)."""
    text = ascii(value) if not isinstance(value, str) else ascii(value)[1:-1]
    return text[:limit] + ("..." if len(text) > limit else "")


def environment_problems(golden):
    """(field, why) for each variable of the golden the child would be given and may not be."""
    out = []
    env = golden.get("environment")
    hold_env = ((golden.get("engine") or {}).get("kernel_variant") or {}).get("env") or {}
    if not isinstance(env, dict) or not isinstance(hold_env, dict):
        return [("environment", "is not a table of variables")]
    for name, value in env.items():
        field = "environment.%s" % shown(name, 64)
        if not isinstance(name, str) or not NAME.match(name) or not isinstance(value, str):
            out.append((field, "is not a plain variable"))
        elif name.startswith(NEVER) or any(w in name for w in NEVER_WORDS):
            out.append((field, "loads code or libraries or points at files: not taken"))
        elif not PLAIN_VALUE.match(value):
            out.append((field, "value is not a plain setting"))
    for name, value in hold_env.items():
        field = "engine.kernel_variant.env.%s" % shown(name, 64)
        if name not in HOLD_VARIABLES:
            out.append((field, "is not a variable a kernel-variant hold sets (%s)"
                        % ", ".join(HOLD_VARIABLES)))
        elif not isinstance(value, str) or not HOLD_VALUE.match(value):
            out.append((field, "value is not a plain setting"))
    return out


def shape_problems(golden):
    """(field, why) where the golden has nothing to reproduce or holds what is not one."""
    prompts = golden.get("prompts")
    calls = (golden.get("batch") or {}).get("calls")
    if not isinstance(prompts, list) or not prompts:
        return [("prompts", "no prompt to reproduce")]
    if not isinstance(calls, list) or not calls or not all(
            isinstance(c, list) and c for c in calls):
        return [("batch.calls", "no generate() call to reproduce")]
    out = []
    ids = set()
    for n, p in enumerate(prompts):
        pid = p.get("id") if isinstance(p, dict) else None
        if not isinstance(pid, str) or not PROMPT_ID.match(pid):
            out.append(("prompts[%d].id" % n, "is not a prompt id"))
            continue
        ids.add(pid)
        for key in ("prompt_token_ids", "token_ids"):
            value = p.get(key)
            if not isinstance(value, list) or not value or not all(
                    type(t) is int and 0 <= t < 2 ** 31 for t in value):
                out.append(("prompts[%d].%s" % (n, key), "is not a non-empty list of token "
                            "ids"))
    for c, call in enumerate(calls):
        for m, pid in enumerate(call):
            if pid not in ids:
                out.append(("batch.calls[%d][%d]" % (c, m), "is not a prompt id of the golden"))
    return out


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fail(code, text):
    print("reproduce_golden: " + text, file=sys.stderr)  # the golden's parts in it: shown()
    return code


def golden_rows(golden, golden_path):
    """Each prompt's recorded top-k rows, [[id, logprob], ...] per position."""
    ref = golden.get("topk")
    if ref is None:  # format 1: inline
        return [p.get("topk") for p in golden["prompts"]]
    path = os.path.join(os.path.dirname(os.path.abspath(golden_path)), ref["file"])
    if sha256(path) != ref["sha256"]:
        raise ValueError("%s is not the golden's top-k table (sha256)" % path)
    from safetensors.numpy import load_file

    arrays = load_file(path)
    rows, start = [], 0
    for length in arrays["lengths"].tolist():
        prompt = []
        for j in range(start, start + length):
            n = int(arrays["counts"][j])
            prompt.append([[int(t), float(lp)] for t, lp in
                           zip(arrays["ids"][j][:n].tolist(), arrays["logprobs"][j][:n].tolist())])
        rows.append(prompt)
        start += length
    return rows


def topk(position_logprobs):
    items = []
    for token_id, lp in position_logprobs.items():
        rank = getattr(lp, "rank", None)
        items.append((int(token_id), float(lp.logprob), rank if rank is not None else 10 ** 9))
    items.sort(key=lambda t: (-t[1], t[2], t[0]))
    return [[tid, logprob] for tid, logprob, _rank in items]


def child(golden, golden_path, model):
    hold = golden["engine"]["kernel_variant"]
    import torch

    for name, answer in sorted(hold["predicates"].items()):
        setattr(torch.cpu, name, (lambda a=bool(answer): a))
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, **golden["engine"]["requested"])
    spec = golden["spec"]
    sampling = dict(spec["sampling"])
    sampling["logprobs"] = golden["logprobs"]
    if sampling.get("seed") is None:
        sampling.pop("seed", None)
    params = SamplingParams(**sampling)
    by_id = {p["id"]: p for p in spec["prompts"]}
    prompts = []
    for p in golden["prompts"]:
        text = by_id.get(p["id"], {}).get("text")
        prompts.append({"prompt": text} if text is not None
                       else {"prompt_token_ids": list(p["prompt_token_ids"])})
    index = {p["id"]: i for i, p in enumerate(golden["prompts"])}
    got = [None] * len(prompts)
    for call in golden["batch"]["calls"]:
        ids = [index[pid] for pid in call]
        for i, out in zip(ids, llm.generate([prompts[i] for i in ids], params, use_tqdm=False)):
            comp = out.outputs[0]
            got[i] = (list(comp.token_ids), [topk(pos) for pos in comp.logprobs or []])
    rows = golden_rows(golden, golden_path)
    differ, tokens, cells = [], 0, 0
    for i, p in enumerate(golden["prompts"]):
        token_ids, table = got[i]
        tokens += len(p["token_ids"])
        if token_ids != list(p["token_ids"]):
            differ.append("prompt %s: tokens %s, the golden's %s" % (
                shown(p["id"]), shown(token_ids), shown(p["token_ids"])))
            continue
        for pos, (want, have) in enumerate(zip(rows[i] or [], table)):
            cells += len(want)
            if [[int(t), float(lp)] for t, lp in want] != have:
                differ.append("prompt %s position %d: top-k %s, the golden's %s"
                              % (shown(p["id"]), pos, shown(have[:3]), shown(want[:3])))
                break
    if differ:
        print("NOT reproduced:\n  " + "\n  ".join(differ[:10]))
        return 1
    if tokens == 0:  # nothing was compared: no verdict to print
        print("NOT reproduced: the golden holds no token to compare")
        return 2
    print("reproduced bit for bit: %d tokens, %d top-k cells, %d prompts"
          % (tokens, cells, len(golden["prompts"])))
    return 0


def main(argv):
    if len(argv) != 3:
        return fail(2, "usage: reproduce_golden.py GOLDEN_JSON MODEL_DIR")
    golden_path, model = argv[1], os.path.abspath(argv[2])
    try:
        with open(golden_path, encoding="utf-8") as fh:
            golden = json.load(fh)
    except (OSError, ValueError) as exc:
        return fail(2, "%s: %s" % (shown(golden_path), shown(str(exc))))
    if not isinstance(golden, dict):
        return fail(2, "%s: not a golden (a JSON object)" % shown(golden_path))
    problems = shape_problems(golden) + environment_problems(golden)
    if problems:
        return fail(2, "%s: refused:\n" % shown(golden_path) + "\n".join(
            "  %s: %s" % (field, why) for field, why in problems[:20]))
    hold = (golden.get("engine") or {}).get("kernel_variant")
    if not hold or hold.get("predicates") is None:
        return fail(2, "%s does not record its kernel-variant hold (engine.kernel_variant"
                    ".predicates): its numbers cannot be reproduced from it alone"
                    % golden_path)
    for name, want in sorted((golden.get("model") or {}).get("files", {}).items()):
        path = os.path.join(model, name)
        if not os.path.isfile(path) or sha256(path) != want["sha256"]:
            return fail(2, "%s is not the golden's %s (model.files sha256)" % (path, name))
    if os.environ.get(CHILD) != "1":
        env = {k: os.environ[k] for k in KEPT if k in os.environ}
        env.update(golden["environment"])
        env.update(hold.get("env") or {})
        env[CHILD] = "1"
        os.execve(sys.executable, [sys.executable, "-I", os.path.abspath(__file__),
                                   golden_path, model], env)
    return child(golden, golden_path, model)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
