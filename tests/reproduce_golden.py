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

The steps, each from one field of the golden:
1. a process whose environment holds only PATH, HOME, the locale, and the golden's
   ``environment`` plus its kernel variant's variables (``engine.kernel_variant.env``);
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
import sys

CHILD = "REPRODUCE_GOLDEN_CHILD"
KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fail(code, text):
    print("reproduce_golden: " + text, file=sys.stderr)
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
            differ.append("prompt %s: tokens %s, the golden's %s" % (p["id"], token_ids,
                                                                     p["token_ids"]))
            continue
        for pos, (want, have) in enumerate(zip(rows[i] or [], table)):
            cells += len(want)
            if [[int(t), float(lp)] for t, lp in want] != have:
                differ.append("prompt %s position %d: top-k %s, the golden's %s"
                              % (p["id"], pos, have[:3], want[:3]))
                break
    if differ:
        print("NOT reproduced:\n  " + "\n  ".join(differ[:10]))
        return 1
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
        return fail(2, "%s: %s" % (golden_path, exc))
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
