"""Committed JSON Schemas of the files oracle-build writes (regenerate: `oracle-build schema`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def generated() -> dict[str, dict[str, Any]]:
    from oracle_build.contracts.cache import Envelope, OracleConfig, Statement
    from oracle_build.contracts.candidate import Candidate
    from oracle_build.contracts.driver import DriverResult
    from oracle_build.contracts.golden import Golden
    from oracle_build.contracts.page import Page
    from oracle_build.contracts.probe import ProbeFacts, ResolvedPlan
    from oracle_build.contracts.record import (
        Anchor,
        BuildRecord,
        DeepIdentity,
        FileManifest,
        NumericsRecord,
    )
    from oracle_build.contracts.reports import (
        DeterminismReport,
        DiffReport,
        ExplainReport,
        MarginReport,
        VerifyReport,
    )
    from oracle_build.contracts.wheelhouse import WheelhouseManifest

    return {"golden.schema.json": Golden.model_json_schema(by_alias=True, mode="validation"),
            "verify-report.schema.json": VerifyReport.model_json_schema(mode="validation"),
            "candidate.schema.json": Candidate.model_json_schema(mode="validation"),
            "explain.schema.json": ExplainReport.model_json_schema(mode="validation"),
            "diff.schema.json": DiffReport.model_json_schema(mode="validation"),
            "margin.schema.json": MarginReport.model_json_schema(mode="validation"),
            "determinism.schema.json": DeterminismReport.model_json_schema(mode="validation"),
            "build-record.schema.json": BuildRecord.model_json_schema(mode="validation"),
            "manifest.schema.json": FileManifest.model_json_schema(mode="validation"),
            "anchor.schema.json": Anchor.model_json_schema(mode="validation"),
            "deep-identity.schema.json": DeepIdentity.model_json_schema(mode="validation"),
            "numerics-record.schema.json": NumericsRecord.model_json_schema(mode="validation"),
            "driver-result.schema.json": DriverResult.model_json_schema(mode="validation"),
            "html-page-data.schema.json": Page.model_json_schema(mode="validation"),
            "wheelhouse-manifest.schema.json": WheelhouseManifest.model_json_schema(
                by_alias=True, mode="validation"),
            "identity-facts.schema.json": ProbeFacts.model_json_schema(mode="validation"),
            "resolved-plan.schema.json": ResolvedPlan.model_json_schema(mode="validation"),
            # the oracle cache's own documents in the registry (the OCI manifest is OCI's)
            "cache-config.schema.json": OracleConfig.model_json_schema(mode="validation"),
            "cache-envelope.schema.json": Envelope.model_json_schema(mode="validation"),
            "cache-statement.schema.json": Statement.model_json_schema(by_alias=True,
                                                                     mode="validation")}


def write() -> list[Path]:
    out = []
    for name, schema in generated().items():
        path = HERE / name
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        out.append(path)
    return out


def committed(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HERE / name).read_text())
    return data
