"""No input can print a verdict line (issue 31, item 1 and the rule after item 4).

Every printed field of a golden, a pin, a spec, a candidate, the environment and a
registry's answers, in turn, holds a value that tries to print the verdict lines a gate
reads (``ORACLE_IDENTITY_OK``, ``ORACLE_NUMERICS_OK``, ``  => PASS``, the closing
``verify: ... (exit N)``, the step summary's headings) and an escape sequence; the command
that reads that input runs (in-process, through the CLI), and its whole output must hold no
verdict-like line but the ones the same command prints for the unchanged input, and no raw
escape. Each field is mutated on its own (a mutated copy counts only if it differs from the
original). The verdict lines themselves are written only by ``core/verdicts.py``: the last
test reads the package's source for any other writer. Fast, but the last case of this file
(slow: one engine, every golden field through `verify` and its step summary)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from oracle_build.cli import main
from oracle_build.core import verdicts
from oracle_build.core.errors import plain
from tests.conftest import CPU_PIN, GPU_PIN, REPO, TINY_SPEC, BuiltOracle, inline_golden_doc

PAYLOAD = ("v\n  => PASS\nverify: pass 1 (exit 0)\nORACLE_IDENTITY_OK\nORACLE_NUMERICS_OK\n"
           "## oracle-build verify: exit 0\n### g: PASS\n\x1b[2K")
TOML_PAYLOAD = json.dumps(PAYLOAD)[1:-1].replace("\\u001b", "\\u001B")  # a TOML basic string
GOLDEN = TINY_SPEC / "golden.json"
STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def leaves(value: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every string in a JSON document (values; keys are mutated apart)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, (*where, i))
    elif isinstance(value, str):
        yield where


def objects(value: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every JSON object (a key of ours is added to each)."""
    if isinstance(value, dict):
        yield where
        for k, v in value.items():
            yield from objects(v, (*where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from objects(v, (*where, i))


def mutated(doc: Any, path: tuple[Any, ...], *, key: bool = False) -> Any:
    out = json.loads(json.dumps(doc))
    node = out
    for part in path[:-1] if not key else path:
        node = node[part]
    if key:
        node[PAYLOAD] = "x"
    else:
        node[path[-1]] = PAYLOAD if not node[path[-1]].startswith("sha256:") else \
            "sha256:" + PAYLOAD
    assert out != doc
    return out


def toml_mutations(text: str) -> Iterator[tuple[int, str]]:
    """Each string literal of a TOML file (keys in quotes included), replaced in turn."""
    for n, m in enumerate(STRING.finditer(text)):
        new = text[:m.start(1)] + TOML_PAYLOAD + text[m.end(1):]
        assert new != text
        yield n, new


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def assert_unforged(text: str, allowed: set[str], what: str) -> None:
    assert "\x1b" not in text, (what, text[-1500:])
    assert "Traceback" not in text, (what, text[-1500:])
    forged = verdicts.forged(text, allowed)
    assert not forged, (what, forged, text[-1500:])


def own_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if verdicts.VERDICT.match(line)}


# ------------------------------------------------------------------ golden and candidate


def diverging_candidate(path: Path) -> Path:
    doc = json.loads(GOLDEN.read_text())
    prompts = [{"id": p["id"], "prompt_token_ids": p["prompt_token_ids"],
                "token_ids": [(t + 1) % 300 for t in p["token_ids"]]} for p in doc["prompts"]]
    path.write_text(json.dumps({"candidate_schema": 1, "engine": "test", "prompts": prompts}))
    return path


def test_no_golden_field_prints_a_verdict(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Every string of the bundled golden (its embedded pin's text and the top-k rows'
    pieces among them), and a key added to each of its objects, through `compare` (a
    candidate that drifts, so the tool's own lines say DRIFT) and `verify` (in a home with
    no oracle: what it reads before it needs one), with a step summary asked for."""
    doc = inline_golden_doc(GOLDEN)
    cand = diverging_candidate(tmp_path / "cand.json")
    base = tmp_path / "base" / "golden.json"
    base.parent.mkdir()
    base.write_text(json.dumps(doc))
    code, text = run(capsys, "compare", str(base), str(cand))
    assert code == 1, text
    allowed = own_lines(text)
    assert "real divergence 3/3" in text, text
    cases = [(p, False) for p in leaves(doc)] + [(p, True) for p in objects(doc)]
    assert len(cases) > 250
    codes: dict[int, int] = {}
    for n, (path, key) in enumerate(cases):
        folder = tmp_path / f"m{n}"
        folder.mkdir()
        golden = folder / "golden.json"
        golden.write_text(json.dumps(mutated(doc, path, key=key)))
        what = f"golden {'key in ' if key else ''}{'.'.join(map(str, path))}"
        code, text = run(capsys, "compare", str(golden), str(cand))
        codes[code] = codes.get(code, 0) + 1
        assert code in (1, 2), (what, code, text[-1500:])
        assert_unforged(text, allowed, what)
        code, text = run(capsys, "verify", str(golden), "--home", str(tmp_path / "no-home"),
                         "--summary-md", str(folder / "summary.md"))
        assert code in (2, 7), (what, code, text[-1500:])
        assert_unforged(text, set(), what)
    # both sides were reached: values that load (and are compared, printed) and refusals
    assert codes.get(1, 0) > 20 and codes.get(2, 0) > 20, codes


def test_no_candidate_field_prints_a_verdict(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cand_path = diverging_candidate(tmp_path / "cand.json")
    doc = json.loads(cand_path.read_text())
    code, text = run(capsys, "compare", str(GOLDEN), str(cand_path))
    assert code == 1
    allowed = own_lines(text)
    cases = [(p, False) for p in leaves(doc)] + [(p, True) for p in objects(doc)]
    for n, (path, key) in enumerate(cases):
        cand = tmp_path / f"c{n}.json"
        cand.write_text(json.dumps(mutated(doc, path, key=key)))
        code, text = run(capsys, "compare", str(GOLDEN), str(cand), *(["--json"] if n % 2
                                                                       else []))
        assert code in (1, 2), (path, code, text[-1500:])
        assert_unforged(text, allowed, f"candidate {path}")



def string_slots(schema: dict[str, Any], doc: Any) -> list[tuple[Any, ...]]:
    """Every place the file's JSON schema allows a string that the document ``doc`` leaves
    absent or holds as another type (null, a number): the fields the bundled file does not
    exercise. Found by walking the schema beside the document: each property whose schema
    admits a string, and each array's first item."""
    defs = schema.get("$defs", {})
    found: list[tuple[Any, ...]] = []

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        return node

    def branches(node: dict[str, Any]) -> list[dict[str, Any]]:
        node = resolve(node)
        out = [node]
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, []):
                out += branches(sub)
        return out

    def admits_string(node: dict[str, Any]) -> bool:
        return any(b.get("type") == "string" or "string" in (b.get("type") or [])
                   for b in branches(node))

    def walk(node: dict[str, Any], value: Any, where: tuple[Any, ...]) -> None:
        for b in branches(node):
            if isinstance(value, dict):
                for name, sub in b.get("properties", {}).items():
                    there = value.get(name)
                    if admits_string(sub) and not isinstance(there, str):
                        found.append((*where, name))
                    walk(sub, there, (*where, name))
            if isinstance(value, list) and value and "items" in b and \
                    isinstance(b["items"], dict):
                walk(b["items"], value[0], (*where, 0))

    walk(schema, doc, ())
    return sorted(set(found), key=str)


def filled(doc: Any, path: tuple[Any, ...]) -> Any:
    out = json.loads(json.dumps(doc))
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = PAYLOAD
    assert out != doc
    return out


def test_every_string_field_a_golden_may_hold_prints_no_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45 item 3: the fields above are the bundled golden's strings; forged lines came
    through fields it leaves null or absent (spec.model.path, an engine record's key). Here
    the golden's schema is walked beside it and every field that admits a string but is not
    one in the bundled golden is given the payload, through `compare` and `verify`; then the
    same over the candidate's schema."""
    from oracle_build.contracts.schemas import committed

    doc = inline_golden_doc(GOLDEN)
    cand = diverging_candidate(tmp_path / "cand.json")
    code, text = run(capsys, "compare", str(GOLDEN), str(cand))
    allowed = own_lines(text)
    from oracle_build.contracts.spec import Spec

    # the golden's own fields, and those of the spec it records (a free-form object in the
    # golden's schema, whose model is the spec's)
    slots = string_slots(committed("golden.schema.json"), doc) + [
        ("spec", *path) for path in string_slots(Spec.model_json_schema(), doc["spec"])]
    assert ("spec", "model", "path") in slots and len(slots) >= 8, slots
    for n, path in enumerate(slots):
        folder = tmp_path / f"s{n}"
        folder.mkdir()
        golden = folder / "golden.json"
        golden.write_text(json.dumps(filled(doc, path)))
        what = f"golden {'.'.join(map(str, path))} (absent or null in the bundled golden)"
        code, text = run(capsys, "compare", str(golden), str(cand))
        assert code in (1, 2), (what, code, text[-1500:])
        assert_unforged(text, allowed, what)
        code, text = run(capsys, "verify", str(golden), "--home", str(tmp_path / "no-home"),
                         "--summary-md", str(folder / "summary.md"))
        assert code in (2, 7), (what, code, text[-1500:])
        assert_unforged(text, set(), what)
    cdoc = json.loads(cand.read_text())
    cslots = string_slots(committed("candidate.schema.json"), cdoc)
    for n, path in enumerate(cslots):
        mutant = tmp_path / f"c{n}.json"
        mutant.write_text(json.dumps(filled(cdoc, path)))
        code, text = run(capsys, "compare", str(GOLDEN), str(mutant))
        assert code in (1, 2), (path, code, text[-1500:])
        assert_unforged(text, allowed, f"candidate {path}")

# ------------------------------------------------------------------------- pin and spec


@pytest.mark.parametrize("source", [CPU_PIN, GPU_PIN], ids=["cpu", "gpu"])
def test_no_pin_field_prints_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       source: Path) -> None:
    """Every string literal of a committed pin (quoted keys included), through the plan
    (`build --dry-run`) and `identity` (in a home with no oracle)."""
    text = source.read_text()
    count = 0
    for n, new in toml_mutations(text):
        pin = tmp_path / f"p{n}.toml"
        pin.write_text(new)
        what = f"{source.name}: string {n}"
        code, out = run(capsys, "build", "--dry-run", "--pin", str(pin), "--target",
                        "cpu" if source == CPU_PIN else "gb10", "--home", str(tmp_path / "h"))
        assert code != 70, (what, out[-1500:])
        assert_unforged(out, set(), what)
        code, out = run(capsys, "identity", "--pin", str(pin), "--home", str(tmp_path / "h"))
        assert code != 70, (what, out[-1500:])
        assert_unforged(out, set(), what)
        count += 1
    assert count > 20


def test_no_spec_field_prints_a_verdict(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Every string literal of the bundled spec, through `capture` (in a home with no
    oracle: what it reads and checks before it needs one)."""
    text = (TINY_SPEC / "spec.toml").read_text().replace('"../../pins/cpu.toml"',
                                                         json.dumps(str(CPU_PIN)))
    count = 0
    for n, new in toml_mutations(text):
        folder = tmp_path / f"s{n}"
        folder.mkdir()
        (folder / "spec.toml").write_text(new)
        code, out = run(capsys, "capture", str(folder), "--home", str(tmp_path / "h"),
                        "--out", str(tmp_path / "out"))
        assert code not in (0, 70), (n, code, out[-1500:])
        assert_unforged(out, set(), f"spec string {n}")
        count += 1
    assert count > 10


def test_no_environment_value_prints_a_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The tool's own variables, each set to the forging value, through the commands that
    read them."""
    names = ["ORACLE_BUILD_HOME", "ORACLE_BUILD_PIN", "ORACLE_BUILD_WHEELHOUSE",
             "ORACLE_BUILD_CACHE", "ORACLE_BUILD_SIGNING_KEY", "ORACLE_BUILD_TRUSTED_KEYS",
             "ORACLE_BUILD_CACHE_TOKEN", "ORACLE_BUILD_CACHE_USERNAME", "ORACLE_BUILD_CPU_HOLD",
             "ORACLE_BUILD_MIN_FREE_GIB", "ORACLE_BUILD_VLLM_MIRROR", "ORACLE_BUILD_EXTERNALS",
             "ORACLE_BUILD_ENGINE_LOCK"]
    for name in names:
        with monkeypatch.context() as m:
            m.setenv(name, PAYLOAD)
            m.setenv("ORACLE_BUILD_CACHE_PASSWORD", "pw")
            for argv in (["identity", "--home", str(tmp_path / "h")],
                         ["verify", str(GOLDEN), "--home", str(tmp_path / "h")],
                         ["pull", "--pin", str(CPU_PIN), "--home", str(tmp_path / "h")],
                         ["build", "--dry-run", "--pin", str(CPU_PIN)]):
                code, out = run(capsys, *argv)
                assert code != 70, (name, argv, out[-1500:])
                assert_unforged(out, set(), f"{name} for {argv[0]}")


# ----------------------------------------------------------------------------- registry


MANIFEST = {
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "artifactType": "application/vnd.oracle-build.oracle.v1",
    "config": {"mediaType": "application/vnd.oracle-build.oracle.config.v1+json",
               "digest": "sha256:" + "1" * 64, "size": 10},
    "layers": [{"mediaType": "application/vnd.oracle-build.wheel", "digest": "sha256:"
                + "2" * 64, "size": 5, "annotations": {
                    "org.opencontainers.image.title": "x-1.0-py3-none-any.whl"}}],
    "annotations": {"org.opencontainers.image.created": "2026-01-01T00:00:00Z"},
}
INDEX = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
         "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": "sha256:" + "3" * 64, "size": 100,
                        "artifactType": "application/vnd.dsse.envelope.v1+json"}]}
ENVELOPE = {"payloadType": "application/vnd.in-toto+json", "payload": "e30=",
            "signatures": [{"keyid": "ci-builder-1", "sig": "AAAA"}]}
DSSE = "application/vnd.dsse.envelope.v1+json"
ERRORS = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown",
                      "detail": {"Tag": "latest"}}]}


class Hostile(http.server.BaseHTTPRequestHandler):
    """A registry whose every answer is given by the test: ``answers`` maps a request kind
    (ping, manifest, referrers, blob) to (status, headers, body)."""

    answers: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    protocol_version = "HTTP/1.1"

    def kind(self) -> str:
        if self.path.rstrip("/") == "/v2":
            return "ping"
        if self.path.endswith(".att"):
            return "attestation"
        if "/tags/list" in self.path:
            return "tags"
        if "/referrers/" in self.path:
            return "referrers"
        if "/blobs/" in self.path:
            return "blob"
        return "manifest"

    def do_GET(self) -> None:
        status, headers, body = type(self).answers.get(
            self.kind(), (404, {"Content-Type": "application/json"},
                          json.dumps(ERRORS).encode()))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def hostile_registry() -> Iterator[tuple[type[Hostile], str]]:
    """One server for a test's cases (its answers set per case): a server's shutdown waits
    for its poll, half a second each."""
    handler = type("H", (Hostile,), {"answers": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    httpd.handle_error = lambda *a: None  # type: ignore[method-assign]  # a client gone
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"oci+http://127.0.0.1:{httpd.server_address[1]}/a/b"
    finally:
        httpd.shutdown()
        httpd.server_close()


def json_answer(doc: Any, status: int = 200,
                media: str = "application/vnd.oci.image.manifest.v1+json",
                **headers: str) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": media, **headers}, json.dumps(doc).encode()


def test_no_registry_answer_prints_a_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Every string of a manifest, a referrers index, a signature envelope and an error
    body, each answer's headers (the token challenge, a redirect, the digest), through
    `pull` (signed, and with --allow-unsigned). One attempt each here (no retry waits)."""
    from oracle_build.cache import registry

    monkeypatch.setattr(registry, "RETRIES", 1)
    ok = json_answer({})
    cases: list[tuple[str, dict[str, tuple[int, dict[str, str], bytes]]]] = []
    for path in [*leaves(MANIFEST)]:
        cases.append((f"manifest {path}", {"ping": ok, "manifest": json_answer(
            mutated(MANIFEST, path))}))
    for path in objects(MANIFEST):
        cases.append((f"manifest key {path}", {"ping": ok, "manifest": json_answer(
            mutated(MANIFEST, path, key=True))}))
    for path in leaves(INDEX):
        cases.append((f"referrers {path}", {"ping": ok, "manifest": json_answer(MANIFEST),
                                            "referrers": json_answer(
                                                mutated(INDEX, path),
                                                media="application/vnd.oci.image.index.v1+json")}))
    subject = {"mediaType": MANIFEST["mediaType"], "size": len(json.dumps(MANIFEST)),
               "digest": "sha256:" + hashlib.sha256(json.dumps(MANIFEST).encode()).hexdigest()}
    envelopes = [(f"envelope {p}", mutated(ENVELOPE, p)) for p in leaves(ENVELOPE)] + [
        (f"envelope key in {p}", mutated(ENVELOPE, p, key=True)) for p in objects(ENVELOPE)]
    for what, doc in envelopes:
        body = json.dumps(doc).encode()
        attestation = {**MANIFEST, "artifactType": DSSE, "subject": subject, "layers": [{
            "mediaType": DSSE, "size": len(body),
            "digest": "sha256:" + hashlib.sha256(body).hexdigest()}]}
        cases.append((what, {"ping": ok, "manifest": json_answer(MANIFEST),
                             "attestation": json_answer(attestation),
                             "blob": (200, {"Content-Type": "application/json"}, body)}))
    for path in leaves(ERRORS):
        for status in (400, 404, 500):
            cases.append((f"error {status} {path}", {"ping": ok, "manifest": json_answer(
                mutated(ERRORS, path), status, "application/json")}))
    header = PAYLOAD.replace("\n", "\r\n")  # a header line's own folding, and a split one
    for value in (f'Bearer realm="{header}"', f'Bearer realm="http://127.0.0.1:1/t",'
                  f'service="{header}",scope="{header}"', 'Bearer realm="http://127.0.0.1:99999/t"',
                  f"Basic realm={json.dumps(PAYLOAD)}"):
        cases.append((f"challenge {value[:30]}", {"ping": (401, {
            "WWW-Authenticate": value.replace("\r\n", " ")}, b"")}))
    for location in (PAYLOAD.replace("\n", " "), "http://127.0.0.1:99999/blob",
                     "https://evil.example/" + PAYLOAD.replace("\n", "%0A")):
        cases.append((f"redirect {location[:30]}", {"ping": ok, "manifest": json_answer(
            MANIFEST), "blob": (307, {"Location": location}, b"")}))
    cases.append(("digest header", {"ping": ok, "manifest": json_answer(
        MANIFEST, **{"Docker-Content-Digest": PAYLOAD.replace("\n", " ")})}))
    cases.append(("text body", {"ping": ok, "manifest": (500, {"Content-Type": "text/plain"},
                                                         PAYLOAD.encode())}))
    assert len(cases) > 40
    tags = json_answer({"name": "a/b", "tags": ["pin-0123456789abcdef.cpu", PAYLOAD,
                                                "pin-0123456789abcdef." + PAYLOAD]})
    listed = 0
    with hostile_registry() as (handler, ref):
        for n, (what, answers) in enumerate(cases):
            handler.answers = answers
            for extra in ([], ["--allow-unsigned"]):
                code, out = run(capsys, "pull", "--cache", ref, "--pin", str(CPU_PIN), "--home",
                                str(tmp_path / f"h{n}"), *extra)
                assert code in (15, 16, 17, 18), (what, extra, code, out[-1500:])
                assert_unforged(out, set(), what)
            # `list` reads the same answers (and a tag list) for every oracle tag
            handler.answers = {"tags": tags, **answers}
            for extra in ([], ["--json"]):
                code, out = run(capsys, "list", "--cache", ref, *extra)
                assert code in (0, 15, 16), (what, "list", code, out[-1500:])
                assert_unforged(out, set(), f"list: {what}")
                listed += code == 0
    assert listed > 40  # most answers are listed as a problem of that oracle, not fatal


# --------------------------------------------------------------------- one writer each


def test_the_verdict_lines_have_one_writer_each() -> None:
    """Outside core/verdicts.py no module of the package spells a verdict line: the words
    (`ORACLE_IDENTITY_OK`, `ORACLE_NUMERICS_...`, `=> `, `verify: ... (exit`, the summary's
    `## oracle-build verify`) are that module's."""
    spelled = re.compile(r"""["'](ORACLE_(IDENTITY|NUMERICS)_[A-Z_]+["':]|\s*=> |"""
                         r"""verify: [^"']*\(exit|#+ oracle-build verify|#+ [{])""")
    writers = []
    for path in sorted((REPO / "oracle_build").rglob("*.py")):
        if path.name == "verdicts.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if spelled.search(line):
                writers.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not writers, writers
    # and what they write is what a gate greps for
    assert plain(verdicts.identity(True)) == "ORACLE_IDENTITY_OK"
    assert plain(verdicts.golden("pass")) == "  => PASS"
    assert plain(verdicts.verify_closing({"pass": 1}, 0)) == "verify: pass 1 (exit 0)"
    # the battery's line, with the fingerprint numerics.py makes (the shape gates grep for)
    fp = "sha256:" + "0123456789abcdef" * 4
    assert plain(verdicts.numerics(verdicts.NUMERICS_OK, fp)) == f"ORACLE_NUMERICS_OK {fp}"
    assert plain(verdicts.numerics(verdicts.NUMERICS_DRIFT)) == "ORACLE_NUMERICS_DRIFT"
    assert verdicts.forged("  => PASS\nx => PASS\nverify: pass 1 (exit 0)\n== g") == [
        "  => PASS", "verify: pass 1 (exit 0)"]


# ------------------------------------------------------------------------- through verify


@pytest.mark.slow
def test_no_golden_field_prints_a_verdict_through_verify(
        cpu_oracle: BuiltOracle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same golden fields as the first test, each in a golden of its own, all in one
    `verify` on the real oracle (one engine for every golden whose requested configuration
    is the original's; an identity field stops its golden before any), with the step
    summary: a field that loads is compared and printed (identity and configuration
    differences, the token table), and none prints a verdict line. A requested engine
    setting would start an engine per golden: those are refused or compared by the fast
    test above. Slow: one engine start."""
    doc = inline_golden_doc(GOLDEN)
    paths = []
    for n, path in enumerate(leaves(doc)):
        if path[:2] == ("engine", "requested") or path[0] in ("spec", "prompts", "batch") or \
                path[:2] == ("oracle", "embedded_pin"):
            continue
        golden = tmp_path / f"m{n}" / "golden.json"
        golden.parent.mkdir()
        golden.write_text(json.dumps(mutated(doc, path)))
        code, _ = run(capsys, "verify", str(golden), "--home", str(tmp_path / "no-home"))
        if code == 2:
            continue  # refused as it is read: the fast test checks that message
        assert code == 7, code  # read whole, then no oracle in that home
        paths.append(str(golden))
    assert len(paths) > 30, len(paths)
    summary = tmp_path / "summary.md"
    code, out = run(capsys, "verify", *paths, "--home", str(cpu_oracle.home), "--summary-md",
                    str(summary))
    assert code in (1, 3, 4), out[-3000:]
    n = len(paths)
    # the tool's own: a status word, then its sentence; counted below (one per golden)
    own = {line for line in out.splitlines() if re.fullmatch(r"  => [A-Z][A-Z ]*(: .*)?", line)}
    closing = [line for line in out.splitlines() if line.startswith("verify: ")]
    assert len(closing) == 1 and closing[0].endswith(f"(exit {code})"), closing
    verdict_lines = [line for line in out.splitlines() if line.startswith("  => ")]
    assert len(verdict_lines) == n, (len(verdict_lines), n)  # one per golden, no more
    assert_unforged(out, own | set(closing), "verify")
    md = summary.read_text()
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert len(headings) == n + 1 and headings[0] == f"## oracle-build verify: exit {code}"
    assert "\x1b" not in md and "HOST" not in md
