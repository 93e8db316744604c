"""Getting the two models of the course and checking what we got.

Why: a student's GPU box fetches Qwen2.5-7B-Instruct and its GPTQ-Int4 twin from modelscope; CI and
offline machines use the embedded fixture. Either way a lab receives a folder, and this module makes
sure that folder is complete and is what it claims to be, before an hour of evaluation trusts it:
  - `resolve_model`: "fixture", a local folder, or a modelscope id (downloaded with a time bound,
    into a staging folder that is moved into place only when complete, so no half-made model folder
    is ever left where a lab would take it for a model);
  - `manifest`: every file with its size and sha256 (what exactly was evaluated);
  - `check_quant_config`: the Int4 model's quantization_config against Qwen's published GPTQ settings;
  - `footprint`: parameters, bytes on disk and in memory, bytes per parameter.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Qwen2.5-*-GPTQ-Int4's quantization_config (and the fixture twin's): what Lab 03/04 assume.
EXPECTED_GPTQ = {"bits": 4, "group_size": 128, "sym": True, "desc_act": False}
GPTQ_FORMATS = ("gptq", "gptq_v2")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
MANIFEST_FILE = ".quantlab-manifest.json"


class FetchError(RuntimeError):
    """A model could not be fetched or found; the message says what to do."""


class ConfigError(ValueError):
    """A model's config is not what the course expects; the message names the field."""


def default_cache_dir() -> Path:
    """$QUANTLAB_MODELS (empty: unset, not the notebook's folder), else ~/.cache/quant-lab/models."""
    return Path(os.environ.get("QUANTLAB_MODELS", "").strip() or Path.home() / ".cache" / "quant-lab" / "models")


def snapshot_dir(cache_dir: str | Path, model_id: str, revision: str = "master") -> Path:
    """Where a complete snapshot of model_id@revision lives in cache_dir."""
    return Path(cache_dir) / f"{model_id.replace('/', '--')}@{revision}"


def is_complete(path: str | Path) -> bool:
    """A model folder: config.json and weights (every shard its index lists)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        return False
    for index in path.glob("*.index.json"):
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        return all((path / s).is_file() for s in shards)
    return any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir())


_DOWNLOAD = """
import sys
from modelscope import snapshot_download
snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3])
"""


def download(model_id: str, cache_dir: str | Path, revision: str = "master", timeout_s: float = 3600,
             command: list[str] | None = None) -> Path:
    """modelscope snapshot_download of model_id@revision into cache_dir, within timeout_s seconds.

    It runs in a subprocess (killed at the bound) and downloads into a staging folder under
    cache_dir/.staging/, renamed to its final place only once complete. On failure the staging folder
    is removed when empty; a partly downloaded one is kept there (never where a model is looked for)
    so that the next attempt resumes. `command` replaces the downloader (tests): it is called with
    model_id, revision and the staging folder as its last three arguments.
    """
    final = snapshot_dir(cache_dir, model_id, revision)
    if is_complete(final):
        return final
    if final.exists():
        raise FetchError(f"{final} exists but is not a complete model folder (not made by this course's "
                         "download, which only renames complete ones): remove it and fetch again")
    staging_root = Path(cache_dir) / ".staging"
    staging = staging_root / final.name
    staging.mkdir(parents=True, exist_ok=True)
    cmd = list(command or [sys.executable, "-c", _DOWNLOAD]) + [model_id, revision, str(staging)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              start_new_session=True)
        failure = None if proc.returncode == 0 else (
            (proc.stderr or proc.stdout).strip().splitlines()[-3:] or [f"exit status {proc.returncode}"])
    except subprocess.TimeoutExpired:
        failure = [f"no complete download within fetch_timeout_s={timeout_s:g} s"]
    if failure is None and not is_complete(staging):
        failure = ["the download finished but the folder has no config.json or weights"]
    if failure is not None:
        partial = any(p.is_file() for p in staging.rglob("*"))
        if not partial:
            shutil.rmtree(staging, ignore_errors=True)
            if staging_root.is_dir() and not any(staging_root.iterdir()):
                staging_root.rmdir()
        raise FetchError(
            f"could not fetch {model_id}@{revision} from modelscope: {' | '.join(failure)}. "
            "Check the network (modelscope.cn reachable?) and rerun; a slow link needs a larger "
            "fetch_timeout_s. Without network: set offline=True and golden_model/int4_model to "
            "'fixture' (the course's own pair) or to a local folder holding the snapshot."
            + (f" The partial download in {staging} is kept so the next attempt resumes." if partial else ""))
    for stale in staging.glob(".*"):          # modelscope's own bookkeeping, not part of the model
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    write_manifest(staging)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, final)
    if staging_root.is_dir() and not any(staging_root.iterdir()):
        staging_root.rmdir()
    return final


def looks_like_path(spec: str) -> bool:
    """A local path rather than a modelscope id ("org/name"): it starts with /, ./, ../ or ~, has more
    than the one org/name separator, uses the OS's own separator, or exists on disk."""
    s = str(spec)
    return (s.startswith(("/", "./", "../", "~", ".\\", "..\\")) or s in (".", "..") or s.count("/") > 1
            or (os.sep != "/" and os.sep in s) or Path(s).expanduser().exists())


def weight_file_problems(path: str | Path) -> list[str]:
    """What is wrong with a folder's safetensors files, read from their headers alone (no tensor loaded):
    a file shorter (or longer) than its header says, or a header that does not parse."""
    problems = []
    for f in sorted(Path(path).glob("*.safetensors")):
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                if n <= 0 or 8 + n > size:
                    raise ValueError("header longer than the file")
                header = json.loads(fh.read(n))
            header.pop("__metadata__", None)
            need = 8 + n + max((int(m["data_offsets"][1]) for m in header.values()), default=0)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            problems.append(f"{f} has no readable safetensors header ({exc}; {size} bytes)")
            continue
        if size != need:
            problems.append(f"{f} is {'truncated' if size < need else 'longer than its header says'}: "
                            f"{size} bytes, its header needs {need}")
    return problems


def check_weight_files(path: str | Path, param: str) -> None:
    """FetchError naming the parameter, the file and what to do when a weight file is damaged."""
    problems = weight_file_problems(path)
    if problems:
        raise FetchError(f"{param}: {'; '.join(problems)}. The download was cut short or the file was "
                         f"damaged: delete the folder {path} and fetch it again (Lab 02 re-downloads a "
                         "modelscope id into cache_dir); for the embedded fixture, git checkout -- fixtures")


def models_summary(models: dict) -> str:
    """One line naming the models a run actually used, fallbacks first and loud."""
    parts = []
    for role, m in models.items():
        if m.get("fallback") or str(m.get("note", "")).startswith("fallback"):
            parts.append(f"{role}: FIXTURE {m['id']} instead of {m.get('requested', 'the requested model')} "
                         f"({m['note']})")
        else:
            parts.append(f"{role}: {m['source']} {m['id']}")
    return "; ".join(parts)


def fallbacks(models: dict) -> list[str]:
    """The roles whose model fell back to the fixture."""
    return [r for r, m in (models or {}).items()
            if isinstance(m, dict) and (m.get("fallback") or str(m.get("note", "")).startswith("fallback"))]


def fallback_warning(results: dict | None) -> str:
    """The loud line for a lab's results whose models fell back to the fixture; "" when none did."""
    models = ((results or {}).get("data") or {}).get("models")
    if not isinstance(models, dict) or not fallbacks(models):
        return ""
    return f"models fell back to the embedded fixture; every number of this run is the fixture's: " \
           f"{models_summary(models)}"


def _check_fetch_settings(cache_dir: Path, revision, timeout_s) -> None:
    """cache_dir, revision and fetch_timeout_s of a hub fetch, before any folder is made under cache_dir."""
    if cache_dir.exists() and not cache_dir.is_dir():
        raise FetchError(f"cache_dir: {cache_dir} is a file, not a folder: give a folder, or leave it empty")
    if not isinstance(revision, str) or not revision.strip():
        raise FetchError(f"revision: {revision!r} must name a modelscope revision, e.g. 'master'")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise FetchError(f"fetch_timeout_s: {timeout_s!r} must be a finite number of seconds > 0, e.g. 3600")


def resolve_model(spec: str, role: str, *, offline: bool, cache_dir: str | Path | None = None,
                  revision: str = "master", timeout_s: float = 3600, fixture_fallback: bool = False,
                  fixture_paths: dict | None = None, command: list[str] | None = None) -> dict:
    """The folder of one of the two models: {"path", "id", "source", "note", "requested", "fallback"}.

    spec: "fixture" (the embedded pair), a local folder, or a modelscope id. role: "golden" or "int4".
    offline=True never touches the network: a hub id must already be in cache_dir. fixture_fallback
    lets an unavailable hub model fall back to the fixture (source "fixture", fallback True, a note).
    A spec that looks like a path (`looks_like_path`) is a folder or an error, never a hub id.
    The weight files are checked for truncation (`check_weight_files`) whatever the source.
    """
    if role not in ("golden", "int4"):
        raise ValueError(f"role must be 'golden' or 'int4', got {role!r}")
    if not spec:
        raise ValueError(f"the {role} model is empty: give 'fixture', a local folder or a modelscope id")

    def checked(found: dict) -> dict:
        found.update(requested=spec, fallback=found["note"].startswith("fallback"))
        check_weight_files(found["path"], f"{role}_model")
        return found

    def fixture(note: str) -> dict:
        paths = fixture_paths
        if paths is None:
            from .fixture import fixture_paths as _fp
            paths = _fp()
        path = Path(paths[role])
        if not is_complete(path):
            raise FetchError(f"the embedded fixture {path} is incomplete: restore fixtures/ from git "
                             "(git checkout -- fixtures) or remake it with scripts/make_fixture.py")
        return {"path": str(path), "id": f"{path.parent.name}/{path.name}", "source": "fixture",
                "note": note}

    param = f"{role}_model"
    if spec == "fixture":
        return checked(fixture("the course's embedded fixture"))
    local = Path(spec).expanduser()
    if local.is_dir():
        if not is_complete(local):
            raise FetchError(f"{param}: {local} has no config.json or no complete weights: "
                             "give a complete model folder")
        return checked({"path": str(local.resolve()), "id": str(local.resolve()), "source": "local",
                        "note": "a local folder"})
    if looks_like_path(spec):
        what = "is a file, not a folder" if local.exists() else "does not exist"
        raise FetchError(f"{param}: the folder {local} {what}. Give an existing model folder (config.json "
                         "and weights), 'fixture' for the course's own pair, or a modelscope id such as "
                         "Qwen/Qwen2.5-7B-Instruct.")
    cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    _check_fetch_settings(cache_dir, revision, timeout_s)
    cached = snapshot_dir(cache_dir, spec, revision)
    if is_complete(cached):
        return checked({"path": str(cached), "id": spec, "source": "modelscope", "note": f"cached in {cache_dir}"})
    if offline:
        why = (f"offline=True and {spec}@{revision} is not in cache_dir {cache_dir}")
        if fixture_fallback:
            return checked(fixture(f"fallback: {why}"))
        raise FetchError(f"{why}. Run once with offline=False where modelscope.cn is reachable, copy the "
                         f"snapshot to {cached}, give a local folder, or set the {role} model to 'fixture'.")
    try:
        path = download(spec, cache_dir, revision, timeout_s, command)
    except FetchError as exc:
        if fixture_fallback:
            return checked(fixture(f"fallback: {exc}"))
        raise
    return checked({"path": str(path), "id": spec, "source": "modelscope", "note": f"downloaded into {cache_dir}"})


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest(path: str | Path, hashes: bool = True) -> list[dict]:
    """Every file of a model folder (hidden bookkeeping excluded): relative name, bytes, sha256."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    return [{"file": str(p.relative_to(path)), "bytes": p.stat().st_size,
             **({"sha256": sha256_file(p)} if hashes else {})} for p in files]


def write_manifest(path: str | Path) -> Path:
    """Record the manifest inside the folder at download time (verify_manifest compares later)."""
    out = Path(path) / MANIFEST_FILE
    out.write_text(json.dumps(manifest(path), indent=1) + "\n", encoding="utf-8")
    return out


def verify_manifest(path: str | Path, current: list[dict] | None = None) -> dict:
    """Compare a folder with the manifest recorded when it was downloaded (if any)."""
    stored_file = Path(path) / MANIFEST_FILE
    current = current if current is not None else manifest(path)
    if not stored_file.is_file():
        return {"recorded": False, "ok": None, "changed": [], "missing": [], "added": []}
    stored = {r["file"]: r for r in json.loads(stored_file.read_text(encoding="utf-8"))}
    now = {r["file"]: r for r in current}
    def differs(a: dict, b: dict) -> bool:   # bytes always; sha256 where both sides hashed the file
        return a.get("bytes") != b.get("bytes") or (
            "sha256" in a and "sha256" in b and a["sha256"] != b["sha256"])

    changed = [f for f in stored if f in now and differs(stored[f], now[f])]
    missing = [f for f in stored if f not in now]
    added = [f for f in now if f not in stored]
    return {"recorded": True, "ok": not (changed or missing), "changed": changed, "missing": missing,
            "added": added}


def quant_config(path: str | Path) -> dict:
    """The quantization_config of config.json (or quantize_config.json); {} for an unquantized model."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    q = cfg.get("quantization_config")
    if not q and (path / "quantize_config.json").is_file():
        q = json.loads((path / "quantize_config.json").read_text(encoding="utf-8"))
    return q or {}


def check_quant_config(path: str | Path, expected: dict | None = None) -> list[dict]:
    """Check the Int4 model's quantization_config field by field; ConfigError naming every mismatch.

    The format is `checkpoint_format` or `format` when present; absent means `gptq` (v1), as in
    Qwen's published Int4 configs (AutoGPTQ wrote none).
    """
    expected = {**EXPECTED_GPTQ, **(expected or {})}
    q = quant_config(path)
    if str(q.get("quant_method", "")).lower() != "gptq":
        raise ConfigError(f"{path}/config.json has no GPTQ quantization_config (quant_method="
                          f"{q.get('quant_method')!r}): int4_model must be a GPTQ checkpoint")
    rows, bad = [], []
    for key, want in expected.items():
        got = q.get(key)
        ok = got == want
        rows.append({"field": key, "expected": want, "found": got, "ok": ok})
        if not ok:
            bad.append(f"{key}={got!r} (expected {want!r})")
    fmt = q.get("checkpoint_format") or q.get("format") or "gptq"
    fmt_ok = str(fmt).lower() in GPTQ_FORMATS
    rows.append({"field": "format", "expected": " or ".join(GPTQ_FORMATS), "found": fmt, "ok": fmt_ok})
    if not fmt_ok:
        bad.append(f"format={fmt!r} (expected one of {GPTQ_FORMATS})")
    if bad:
        raise ConfigError(f"{path}: quantization_config does not match the course's GPTQ-Int4 settings: "
                          + "; ".join(bad) + ". Use a Qwen2.5 GPTQ-Int4 checkpoint (bits 4, group 128, sym, "
                          "desc_act off), or remake the fixture twin with scripts/make_fixture.py.")
    return rows


def safetensors_header(path: Path) -> dict:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of one safetensors file, read without loading a tensor."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return header


def count_parameters(path: str | Path) -> int:
    """The model's logical parameter count from its safetensors headers, without loading it.

    A GPTQ layer counts its unpacked weight (qweight [in*32/bits / 32*bits, out] -> in*out), not its
    qzeros, scales and g_idx, so both models of a pair give (about) the same number.
    """
    path = Path(path)
    bits = int(quant_config(path).get("bits", 4) or 4)
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        for name, meta in safetensors_header(f).items():
            shape = meta["shape"]
            n = 1
            for s in shape:
                n *= s
            if name.endswith(".qweight"):
                total += n * (32 // bits)
            elif not name.endswith((".qzeros", ".scales", ".g_idx")):
                total += n
    return total


def model_memory_bytes(model) -> int:
    """Bytes the loaded model holds in parameters and buffers (shared tensors counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.data_ptr(), t.numel())
        if key in seen or t.device.type == "meta":
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def footprint(path: str | Path, model=None) -> dict:
    """Parameters, weight bytes on disk, bytes in memory (when a loaded model is given), bytes per parameter."""
    path = Path(path)
    params = count_parameters(path)
    disk = sum(p.stat().st_size for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    out = {"parameters": params, "disk_bytes": disk, "disk_bytes_per_param": disk / params if params else None}
    if model is not None:
        mem = model_memory_bytes(model)
        out.update(memory_bytes=mem, memory_bytes_per_param=mem / params if params else None)
    return out
