"""Make a large synthetic golden (default 2,000 prompts x 256 tokens x top-20) from the
committed tiny golden's records, for measuring verify's own overhead.

    python benchmarks/large_golden.py OUT/golden.json [PROMPTS TOKENS K]

The file it writes holds its top-k rows inline (format 1's way, and format 2's without a
sidecar): the bundled golden's record names a top-k sidecar, which this file does not have,
so that reference is dropped. The result is loaded (validated) before it is reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def make(dest: Path, prompts: int = 2000, tokens: int = 256, k: int = 20) -> Path:
    base = json.loads((REPO / "goldens" / "tiny-llama-greedy" / "golden.json").read_text())
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 300, size=(prompts, tokens, k))
    lps = -np.sort(rng.exponential(1.0, size=(prompts, tokens, k)), axis=2)
    recs = []
    for i in range(prompts):
        toks = ids[i, :, 0].tolist()
        topk = [[[int(t), float(lp)] for t, lp in zip(ids[i, j], lps[i, j], strict=True)]
                for j in range(tokens)]
        recs.append({"id": f"p{i}", "text": None, "prompt_token_ids": [5, 6, 7, i % 300],
                     "token_ids": toks, "output_text": "", "finish_reason": "length",
                     "topk": topk})
    base["topk"] = None  # the rows are inline: no sidecar (a record naming one is refused)
    base["prompts"] = recs
    base["legs"]["tokens"] = [[r["token_ids"] for r in recs]] * 2
    base["batch"]["calls"] = [[r["id"]] for r in recs]
    base["spec"]["prompts"] = [{"id": r["id"], "token_ids": r["prompt_token_ids"],
                                "text": None} for r in recs]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(base))
    return dest


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the golden.json to write (its folder is made)")
    ap.add_argument("sizes", nargs="*", type=int, metavar="PROMPTS TOKENS K",
                    help="the shape (default 2000 256 20)")
    args = ap.parse_args()
    if len(args.sizes) not in (0, 3) or any(n <= 0 for n in args.sizes):
        ap.error("give PROMPTS TOKENS K together, each above 0, or none of them")
    out = make(args.out, *args.sizes)
    sys.path.insert(0, str(REPO))
    from oracle_build.contracts.golden import load_golden

    golden = load_golden(out)  # a file verify refuses is no benchmark input
    print(out, out.stat().st_size, f"{len(golden.prompts)} prompts")
