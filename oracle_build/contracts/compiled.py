"""A source pin's established compiled bytes (pins/<id>.compiled.toml, named by the pin's
``compiled``): for each build that established them, the pin's content hash, the target, the
toolchain (the compilers and the linker, by their own --version lines) and the sha256 of every
file a compiler made that the built distribution's wheel installs (for vLLM on CPU: the three
``_C*.abi3.so``, ``fs_io_C``, ``spinloop``).

What a wheel pin's lock is for its wheels, this file is for a source pin's compiled files: the
bytes a rebuild must give. It is the recipe's output, not its input: it is not part of the
pin's content hash (writing it does not move the oracle to another key), and ``oracle-build
lock --compiled`` writes it from a built oracle's record, never by hand. An entry applies to
an oracle built from a pin with the same content hash, for the same target, with the same
toolchain (other compilers give other bytes: that is a different entry, established in its
turn, or a mismatch identity names).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from oracle_build.contracts.base import SafeName, Sha256, Strict, unsafe_values
from oracle_build.core.errors import BadInput
from oracle_build.core.files import load_toml, validate

COMPILED_SCHEMA = 1
# The version of the levers a source build sets so that its bytes depend on the pin and the
# toolchain only (docs/reproducible-builds.md): bytes established under one recipe say nothing
# of a build under another (its entries are for that recipe: unestablished, not a mismatch).
#   1: ccache's base_dir rewrote the compiler's paths relative (entries without `recipe`)
#   2: -ffile-prefix-map=<staging>=. for every compiler; ccache in depend mode
RECIPE = 2
# every such file's name ends so (the pin's `compiled` is checked): never taken for a pin
COMPILED_SUFFIX = ".compiled.toml"

__all__ = ["COMPILED_SCHEMA", "COMPILED_SUFFIX", "RECIPE", "CompiledEntry", "CompiledLock",
           "load_compiled", "render"]


class CompiledEntry(Strict):
    pin_hash: Sha256  # the pin's content hash the build was of
    target: SafeName
    machine: str = Field(max_length=64, pattern=r"^[a-z0-9_]+$")
    toolchain: str = Field(max_length=1000)  # record.toolchain_key of the build
    recipe: int = Field(default=1, ge=1, le=1000)  # RECIPE of the build; absent: 1
    established_utc: str = Field(max_length=64)
    # path under site-packages -> sha256
    files: dict[str, Sha256] = Field(min_length=1, max_length=10000)


class CompiledLock(Strict):
    schema_: int = Field(alias="schema")
    pin: SafeName  # the pin's id
    established: list[CompiledEntry] = Field(default_factory=list, max_length=1000)

    def entries_for(self, pin_hash: str, target: str, machine: str,
                    recipe: int = RECIPE) -> list[CompiledEntry]:
        return [e for e in self.established if (e.pin_hash, e.target, e.machine, e.recipe)
                == (pin_hash, target, machine, recipe)]


def load_compiled(path: Path) -> CompiledLock:
    if path.is_symlink():
        raise BadInput(path, [("<file>", "is a symbolic link: refused (the file of a pin's "
                               "compiled bytes lies beside it, itself)")])
    data = load_toml(path)
    problems = unsafe_values(data)
    if problems:  # its values are printed (identity's mismatches): no line of their own
        raise BadInput(path, problems)
    model = validate(CompiledLock, data, path)
    if model.schema_ != COMPILED_SCHEMA:
        raise BadInput(path, [("schema", f"{model.schema_} is not one this oracle-build reads "
                                         f"(it reads {COMPILED_SCHEMA})")])
    for i, entry in enumerate(model.established):
        for rel in entry.files:
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or any(
                    ord(c) < 32 or c in "\"\\" for c in rel):
                raise BadInput(path, [(f"established[{i}].files", "a key is not a plain "
                                       "relative path under site-packages")])
    return model


def _quote(value: str) -> str:
    """A TOML basic string of a value the models above admit (no control characters, no
    quotes or backslashes in paths; the toolchain's lines escaped)."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if ord(c) >= 32 else f"\\u{ord(c):04x}" for c in out) + '"'


def render(model: CompiledLock) -> str:
    """The file's text: one renderer, read back by load_compiled."""
    lines = [
        f"# The compiled bytes of pin {model.pin!r}, established by `oracle-build lock "
        "--compiled`",
        "# from built oracles (docs/reproducible-builds.md). Not part of the pin's content "
        "hash.",
        "# Regenerate it, review the diff, commit it.",
        f"schema = {model.schema_}",
        f"pin = {_quote(model.pin)}",
    ]
    for e in model.established:
        lines += ["", "[[established]]",
                  f"pin_hash = {_quote(e.pin_hash)}",
                  f"target = {_quote(e.target)}",
                  f"machine = {_quote(e.machine)}",
                  f"toolchain = {_quote(e.toolchain)}",
                  f"recipe = {e.recipe}",
                  f"established_utc = {_quote(e.established_utc)}",
                  "[established.files]"]
        lines += [f"{_quote(rel)} = {_quote(digest)}" for rel, digest in sorted(e.files.items())]
    return "\n".join(lines) + "\n"
