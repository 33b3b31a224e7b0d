"""Another engine's output, compared offline with a golden (``oracle-build compare``).

Candidate file (JSON, schema ``oracle_build/contracts/schemas/candidate.schema.json``)::

    {"candidate_schema": 1, "engine": "vllm.cpp@abc123",
     "prompts": [{"id": "capital", "prompt_token_ids": [..], "token_ids": [..],
                  "topk": [[[token_id, logprob], ...], ...]}]}

``id`` is optional (prompts then match the golden's by order); ``topk`` is optional.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from oracle_build.contracts.base import Logprob, SafeName, Strict, TokenId, check_schema_number
from oracle_build.contracts.golden import Golden
from oracle_build.core.errors import BadInput
from oracle_build.core.files import load_json, validate

CANDIDATE_SCHEMA = 1


class CandidatePrompt(Strict):
    id: SafeName | None = None
    prompt_token_ids: list[TokenId] = Field(min_length=1)
    token_ids: list[TokenId]
    topk: list[list[tuple[TokenId, Logprob]]] | None = None

    @model_validator(mode="after")
    def _shape(self) -> CandidatePrompt:
        if self.topk is not None:
            if len(self.topk) != len(self.token_ids):
                raise ValueError(f"topk has {len(self.topk)} positions for "
                                 f"{len(self.token_ids)} tokens")
            for pos, row in enumerate(self.topk):
                if any(a[1] < b[1] for a, b in itertools.pairwise(row)):
                    raise ValueError(f"topk[{pos}] is not sorted best first")
        return self


class Candidate(Strict):
    candidate_schema: int
    engine: str | None = None
    prompts: Annotated[list[CandidatePrompt], Field(min_length=1)]


def load_candidate(path: Path) -> Candidate:
    data = load_json(path)
    check_schema_number(data, path, "candidate_schema", CANDIDATE_SCHEMA)
    return validate(Candidate, data, path)


def pair(golden: Golden, cand: Candidate, path: Path) -> list[tuple[int, CandidatePrompt]]:
    """(golden prompt index, candidate prompt) for every golden prompt exactly once, in the
    golden's order: by id when the candidate gives ids (all of them), else by order (the same
    count). A missing, duplicated or unknown prompt is bad input: a gate that compared only
    what the candidate chose to hold would pass an engine that crashed on a prompt."""
    index = {p.id: i for i, p in enumerate(golden.prompts)}
    with_ids = [p.id is not None for p in cand.prompts]
    if any(with_ids) and not all(with_ids):
        n = with_ids.index(False)
        raise BadInput(path, [(f"prompts[{n}].id", "missing: give every prompt its id, or none "
                               "(prompts are then matched by order)")])
    if not any(with_ids):
        if len(cand.prompts) != len(golden.prompts):
            raise BadInput(path, [("prompts", f"{len(cand.prompts)} prompts without ids; the "
                                   f"golden has {len(golden.prompts)}")])
        return list(enumerate(cand.prompts))
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for n, p in enumerate(cand.prompts):
        assert p.id is not None
        if p.id not in index:
            problems.append((f"prompts[{n}].id", f"{p.id!r} is not a prompt of golden "
                             f"{golden.name} ({', '.join(index)})"))
        elif p.id in seen:
            problems.append((f"prompts[{n}].id", f"{p.id!r} given more than once (first at "
                             f"prompts[{seen[p.id]}])"))
        else:
            seen[p.id] = n
    missing = [pid for pid in index if pid not in seen]
    if missing:
        problems.append(("prompts", f"missing: golden {golden.name}'s prompts "
                         f"{', '.join(missing)} are not in the candidate"))
    if problems:
        raise BadInput(path, problems, hint="every golden prompt is compared exactly once")
    return sorted(((index[p.id], p) for p in cand.prompts if p.id is not None),
                  key=lambda item: item[0])
