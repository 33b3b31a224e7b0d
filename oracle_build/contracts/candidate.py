"""Another engine's output, compared offline with a golden (``oracle-build compare``).

Candidate file (JSON, schema ``oracle_build/contracts/schemas/candidate.schema.json``)::

    {"candidate_schema": 1, "engine": "vllm.cpp@abc123",
     "prompts": [{"id": "capital", "prompt_token_ids": [..], "token_ids": [..],
                  "topk": [[[token_id, logprob], ...], ...]}]}

``id`` is optional (prompts then match the golden's by order); ``topk`` is optional.
"""

from __future__ import annotations

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
        if self.topk is not None and len(self.topk) != len(self.token_ids):
            raise ValueError(f"topk has {len(self.topk)} positions for {len(self.token_ids)} "
                             "tokens")
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
    """(golden prompt index, candidate prompt): by id where given, else by order."""
    index = {p.id: i for i, p in enumerate(golden.prompts)}
    if all(p.id is not None for p in cand.prompts):
        out = []
        for n, p in enumerate(cand.prompts):
            if p.id not in index:
                raise BadInput(path, [(f"prompts[{n}].id", f"{p.id!r} is not a prompt of "
                                       f"golden {golden.name} ({sorted(index)})")])
            out.append((index[p.id], p))
        return out
    if len(cand.prompts) != len(golden.prompts):
        raise BadInput(path, [("prompts", f"{len(cand.prompts)} prompts without ids; the "
                               f"golden has {len(golden.prompts)}")])
    return list(enumerate(cand.prompts))
