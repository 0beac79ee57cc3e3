"""The receipt schema, read from its description: receipt_schema.json beside this module.

That file is what `harness schema` prints (harness/receipt/receipt_schema.cpp and each
engine's additions): every group, dataset and manifest attribute with its type, shape,
presence, the minor that added it and who writes it. python/tests/test_receipt_schema.py
holds the file equal to the harness's output, so the two sides cannot drift; the constants
and named paths below are read from it, never repeated.
"""
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import h5py

DESCRIPTION_FILE = Path(__file__).with_name("receipt_schema.json")
DESCRIPTION: Dict[str, Any] = json.loads(DESCRIPTION_FILE.read_text(encoding="utf-8"))
_CONSTANTS = DESCRIPTION["constants"]

SCHEMA_VERSION: int = DESCRIPTION["schema_version"]  # major: a reader refuses any other
SCHEMA_MINOR: int = DESCRIPTION["schema_minor"]  # additions an older reader may ignore

SKETCH_WIDTH: int = _CONSTANTS["sketch_width"]  # buckets of the count sketch
SKETCH_BLOCK: int = _CONSTANTS["sketch_block"]  # elements per sketched block
SKETCH_METHOD: str = _CONSTANTS["sketch_method"]

HASH_FAMILIES: Tuple[str, ...] = tuple(_CONSTANTS["hash_families"])  # receipt order of /hashes
SKETCH_FAMILIES: Tuple[str, ...] = tuple(_CONSTANTS["sketch_families"])  # receipt order of /sketches
CHECKPOINTS_IN_RECEIPT: str = _CONSTANTS["checkpoints_in_receipt"]  # /checkpoints' storage when held

# The core's groups and datasets by name ("loss": "/steps/loss"), spelled once in
# harness/receipt/receipt_paths.h: the reader and writer below name paths only through these.
PATHS: Dict[str, str] = _CONSTANTS["paths"]


def hashes_path(family: str) -> str:
    """/hashes/<family>: one XXH3-64 per step and tensor."""
    return f"{PATHS['hashes']}/{family}"


def sketch_paths(family: str) -> Tuple[str, str]:
    """(/sketches/<family>_l2, /sketches/<family>_projection)."""
    return f"{PATHS['sketches']}/{family}_l2", f"{PATHS['sketches']}/{family}_projection"


def leaf(path: str) -> str:
    """A path's last segment, as a group creates it: "/steps/loss" -> "loss"."""
    return path.rsplit("/", 1)[-1]


def _matches(pattern: str, path: str) -> bool:
    """Segment by segment; a '*' segment matches any one non-empty name."""
    want, got = pattern.split("/"), path.split("/")
    return len(want) == len(got) and all(w == g or (w == "*" and g) for w, g in zip(want, got))


def dataset_entry(path: str) -> Optional[Dict[str, Any]]:
    """The description of the dataset at `path`: its exact entry, else the first pattern that matches."""
    entries = DESCRIPTION["datasets"]
    exact = next((d for d in entries if d["path"] == path), None)
    return exact or next((d for d in entries if "*" in d["path"] and _matches(d["path"], path)), None)


def attribute_entry(group: str, name: str) -> Optional[Dict[str, Any]]:
    """The description of attribute `name` of `group` ("/manifest"), None where there is none."""
    return next((a for a in DESCRIPTION["attributes"] if a["path"] == f"{group}/{name}"), None)


def group_entry(path: str) -> Optional[Dict[str, Any]]:
    return next((g for g in DESCRIPTION["groups"] if g["path"] == path), None)


def dataset_rank(path: str) -> Optional[int]:
    """The number of dimensions the description gives the dataset, None for any (or none described)."""
    entry = dataset_entry(path)
    return None if entry is None or entry["shape"] is None else len(entry["shape"])


def undescribed(file: h5py.File) -> List[str]:
    """What the file holds that the description does not: top-level groups, the datasets of
    described groups, and /manifest attributes (where a writer's free-form extras go)."""
    found: List[str] = [f"group /{name}" for name in file if isinstance(file[name], h5py.Group)
                        and group_entry(f"/{name}") is None]
    def visit(name: str, obj: Any) -> None:
        path = f"/{name}"
        if isinstance(obj, h5py.Dataset) and group_entry(path[:path.find("/", 1)]) and dataset_entry(path) is None:
            found.append(f"dataset {path}")
    file.visititems(visit)
    if "manifest" in file:
        found += [f"/manifest attribute {a}" for a in file["manifest"].attrs if attribute_entry("/manifest", a) is None]
    return found


def missing_required(file: h5py.File) -> List[str]:
    """The required datasets and attributes the file lacks, where their group is there (or must
    be); an entry binds the receipts of its minor and later ones, as `harness validate` reads it."""
    manifest = file["manifest"].attrs if "manifest" in file else {}
    minor = int(manifest.get("schema_minor", 0))

    def required(entry: Dict[str, Any]) -> bool:
        return entry["presence"] == "required" and entry["since_minor"] <= minor

    def group_there(group: str) -> bool:
        entry = group_entry(group)
        return group.lstrip("/") in file or (entry is not None and entry["presence"] == "required")
    missing = [d["path"] for d in DESCRIPTION["datasets"] if required(d) and "*" not in d["path"]
               and group_there(d["path"].rsplit("/", 1)[0]) and d["path"].lstrip("/") not in file]
    for a in DESCRIPTION["attributes"]:
        group, name = a["path"].rsplit("/", 1)
        if required(a) and group_there(group) and (
                group.lstrip("/") not in file or name not in file[group.lstrip("/")].attrs):
            missing.append(a["path"])
    return missing
