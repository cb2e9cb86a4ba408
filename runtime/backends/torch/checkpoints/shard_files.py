"""Checkpoints, resume state and final weights of a torch-backend run: sharded safetensors files that every
worker writes itself, straight into the run directory, plus an index the controller writes last
(docs/architecture.md, Runtime; issue 8: "--resume restarts from the last checkpoint (weights, optimizer state,
step, RNG)"; issue 14: "never through the control channel", "reshard on load").

A checkpoint is taken at a step boundary s: every training node of steps < s has completed. It holds, per
trained model, every version a node of step >= s may still read (versions s - tau(m) .. s, the float32
masters), the Adam state after version s, the torch RNG state of every worker and the metrics of the steps
done. Rollouts draw from counter-based generators seeded by (seed, step, sequence), so the seed and the
step fix all sampling from s on.

Files (the format, "rpeg-torch-checkpoint/2"):

    RUN_DIR/checkpoints/step-000004/rank-00000-actor.safetensors   per worker and trained model: its shards of the
                                                             model's master, Adam state and kept versions
    RUN_DIR/checkpoints/step-000004/rank-00000.safetensors   per worker: its RNG state
    RUN_DIR/checkpoints/step-000004/index.json               written last, by the controller (it names every file)
    RUN_DIR/final/rank-*.safetensors + index.json            the final weights ("rpeg-torch-final/2")

Tensor keys (the same key in every file that holds a piece of it):
    weights/<model>/v<version>/<param>     a version's weights (checkpoints)
    weights/<model>/<param>                the final weights
    adam/<model>/<param>/<state>           Adam state (exp_avg, exp_avg_sq: sliced like the parameter;
                                           step: a 0-dim scalar, one copy)
    rng/<rank>                             torch.get_rng_state() of worker <rank> (uint8)

index.json: {"format", "step", "identity" (what makes two runs the same run: seed, RL config, workload,
models with their kinds, architectures and parameter shapes, staleness; not the plan), "plan_hash" (of
the plan that wrote it: informative only), "versions" {model: [v, ...]}, "optimizer" [model, ...],
"metrics" {step: {name: value}}, "files" {file: {"bytes", "sha256"}}, "tensors" {key: {"shape" (global),
"dtype", "shards": [{"file", "offsets", "shape"}]}}}. Each shard is a box of the global tensor: `offsets`
its first index along every dimension, `shape` its extent. A file also records its boxes in its own
safetensors metadata ("rpeg" key), so a shard file is self-describing.

A checkpoint directory is written as step-NNNNNN.partial and renamed once the index is in it
(`rpegc.outputs.PendingDirectory`: fsync files, directory and parent), so a crash in the middle of a
checkpoint leaves the previous one usable; a .partial left behind is ignored, and removed by the next
run. After a checkpoint is complete, only the newest `keep` (--keep-checkpoints, default 2) stay.

Resume (`Reader`): each worker reads from the shard files only the boxes it needs for its own layout,
assembling a piece from all shards that overlap it, so a run checkpointed under one plan resumes under
any other plan of the same program (other dp/pp/tp, other devices): compatibility is the run identity,
not the plan hash. It executes `resume_plan(plan, s)`: the nodes of steps >= s; every weights version
they read that no remaining node produces becomes an initial artifact, installed from the checkpoint in
the layout its readers use.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import time
from typing import Callable, Iterable, Optional

import torch

from rpegc.core.ir.errors import Loc, RpegError, error_line
from rpegc.outputs import PendingDirectory, write_text
from rpegc.runtime.plan import RunPlan
from rpegc.runtime.backends.torch.rl.finite import finite_tensor
from rpegc.runtime.backends.torch.controller.inbox import warn
from rpegc.runtime.backends.torch.parallel.layout import Layout, Piece, rank_pieces
from rpegc.runtime.backends.torch.checkpoints.run_dir import CHECKPOINT_DIR, FINAL, complete_checkpoints
from rpegc.runtime.backends.torch.checkpoints.safetensors_stream import write_safetensors

FORMAT = "rpeg-torch-checkpoint/2"
FINAL_FORMAT = "rpeg-torch-final/2"
INDEX = "index.json"
PARTIAL = PendingDirectory.SUFFIX

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, shape) of a piece of a global tensor


class CheckpointError(RpegError):
    """A checkpoint (or final-weights) file that cannot be used; one line naming the file."""

    def __init__(self, path: str, message: str):
        super().__init__(Loc(path, 0, 0), message)


# ---------------------------------------------------------------------------------------------------
# Names


def checkpoint_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, f"step-{step:06d}")


def final_path(run_dir: str) -> str:
    return os.path.join(run_dir, FINAL)


def shard_file(rank: int, part: str = "") -> str:
    """A rank's file of a checkpoint or the final weights; `part` names one of several a rank writes (a model's)."""
    return f"rank-{rank:05d}{'-' + part if part else ''}.safetensors"


def weights_key(model: str, version: Optional[int], name: str) -> str:
    return f"weights/{model}/{name}" if version is None else f"weights/{model}/v{version}/{name}"


def adam_key(model: str, name: str, state: str) -> str:
    return f"adam/{model}/{name}/{state}"


def rng_key(rank: int) -> str:
    return f"rng/{rank}"


def latest_checkpoint(run_dir: str) -> Optional[str]:
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def remove_partials(run_dir: str) -> None:
    """Drop what an interrupted checkpoint or final-weights write left (never a complete checkpoint)."""
    left = glob.glob(os.path.join(run_dir, CHECKPOINT_DIR, "*" + PARTIAL)) + [final_path(run_dir) + PARTIAL]
    left += glob.glob(os.path.join(run_dir, CHECKPOINT_DIR, ".step-*.tmp-old")) + \
        glob.glob(os.path.join(run_dir, f".{FINAL}.tmp-old"))
    for path in left:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def clear_run_dir(run_dir: str) -> None:
    """A fresh run owns its directory: drop the checkpoints and final weights of an earlier run there."""
    remove_partials(run_dir)
    for _, path in complete_checkpoints(run_dir):
        shutil.rmtree(path)
    if os.path.isdir(final_path(run_dir)):
        shutil.rmtree(final_path(run_dir))


def prune_checkpoints(run_dir: str, keep: int) -> list[str]:
    """Remove all but the newest `keep` complete checkpoints; returns the removed directories."""
    found = complete_checkpoints(run_dir)
    gone = [path for _, path in found[:max(0, len(found) - keep)]]
    for path in gone:
        shutil.rmtree(path)
    return gone


# ---------------------------------------------------------------------------------------------------
# The run identity


def _plain(obj):
    """JSON values of a config: dataclasses as dicts, tuples as lists, dtypes as names."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # not "loc": where a value was written in the source does not change the run
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "loc"}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def run_identity(seed: int, cfg, models: dict, shapes: dict[str, dict[str, tuple[int, ...]]],
                 tau: dict[str, int]) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint (the plan may differ)."""
    return {
        "seed": seed,
        "run": _plain(cfg),
        "models": {m: {"kind": s.kind, "arch": _plain(s.arch), "init_seed": s.seed,
                       "params": {n: list(shape) for n, shape in shapes[m].items()},
                       **({"hf": s.hf} if getattr(s, "hf", None) else {})} for m, s in sorted(models.items())},
        "staleness": {m: int(t) for m, t in sorted(tau.items())},
    }


def identity_difference(saved: dict, current: dict) -> Optional[str]:
    """The first thing that differs between two run identities, in words; None if they are the same."""
    if saved == current:
        return None
    order = ["seed", "staleness", "models", "run"]  # the seed first: it also changes the models' init seeds
    top = next((k for k in order + sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)), None)
    path = _first_difference(saved.get(top), current.get(top), [top]) if top is not None else []
    names = {"seed": "--seed", "run": "the run configuration", "models": "model", "staleness": "staleness"}
    head = names.get(path[0], path[0]) if path else "the run identity"
    rest = path[1:]
    if path and path[0] in ("models", "staleness") and rest:
        head, rest = f"{head} @{rest[0]}", rest[1:]
    what = " ".join([head] + ([".".join(rest)] if rest else []))
    a, b = _at(saved, path), _at(current, path)
    return f"{what} is {_short(a)} in the checkpoint, {_short(b)} here"


def _first_difference(a, b, path: list[str]) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), path + [k])
    return path


def _at(obj, path: list[str]):
    for k in path:
        obj = obj.get(k) if isinstance(obj, dict) else None
    return obj


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------------
# Writing (workers: shard files; controller: the index)


def piece_box(piece: Piece, shape: tuple[int, ...]) -> Box:
    """The box of the global tensor a layout piece covers."""
    offsets = [0] * len(shape)
    extent = list(shape)
    if piece.dim is not None:
        offsets[piece.dim] = piece.lo
        extent[piece.dim] = piece.hi - piece.lo
    return tuple(offsets), tuple(extent)


def write_shard_file(path: str, tensors: dict[str, tuple[torch.Tensor, Box, tuple[int, ...]]]) -> dict:
    """Write `tensors` (key -> (local tensor, its box, the global shape)) as one safetensors file, fsynced.

    Returns the report the controller indexes: plain str/int/list values only (it travels as a message)."""
    t0 = time.perf_counter()
    boxes = {k: {"offsets": list(box[0]), "shape": list(box[1]), "global": list(glob_shape),
                 "dtype": str(t.dtype).removeprefix("torch.")}
             for k, (t, box, glob_shape) in tensors.items()}
    for k, (t, box, _) in tensors.items():
        if tuple(t.shape) != tuple(box[1]):
            raise ValueError(f"{k}: tensor of shape {tuple(t.shape)} for a box of shape {box[1]}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        size, digest = write_safetensors(fd, {k: t for k, (t, _, _) in tensors.items()},
                                         {"format": FORMAT, "rpeg": json.dumps(boxes, sort_keys=True)})
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"file": os.path.basename(path), "bytes": size, "sha256": digest, "tensors": boxes,
            "write_s": time.perf_counter() - t0}


def build_index(fmt: str, reports: Iterable[dict], **fields) -> dict:
    """The index of a checkpoint (or the final weights) from the workers' file reports; checks that the
    shards of every tensor tile it exactly (no gap, no overlap)."""
    files: dict[str, dict] = {}
    tensors: dict[str, dict] = {}
    for rep in sorted(reports, key=lambda r: r["file"]):
        files[rep["file"]] = {"bytes": rep["bytes"], "sha256": rep["sha256"]}
        for key, b in sorted(rep["tensors"].items()):
            entry = tensors.setdefault(key, {"shape": b["global"], "dtype": b["dtype"], "shards": []})
            if entry["shape"] != b["global"] or entry["dtype"] != b["dtype"]:
                raise RpegError(None, f"workers disagree on {key}: {entry['shape']} {entry['dtype']} vs "
                                f"{b['global']} {b['dtype']}")
            entry["shards"].append({"file": rep["file"], "offsets": b["offsets"], "shape": b["shape"]})
    for key, entry in tensors.items():
        why = tiling_error(entry["shape"], [(s["offsets"], s["shape"]) for s in entry["shards"]])
        if why:
            raise RpegError(None, f"the shards of {key} {why}")
    return {"format": fmt, **fields, "files": files, "tensors": tensors}


def tiling_error(shape: list[int], boxes: list[tuple[list[int], list[int]]]) -> Optional[str]:
    """Why `boxes` do not tile a tensor of `shape` exactly (inside it, disjoint, covering it), or None."""
    total = 1
    for s in shape:
        total *= s
    covered = 0
    for i, (off, ext) in enumerate(boxes):
        if len(off) != len(shape) or len(ext) != len(shape) or \
                any(o < 0 or e < 0 or o + e > s for o, e, s in zip(off, ext, shape)):
            return f"include a box {off} + {ext} outside the shape {shape}"
        n = 1
        for e in ext:
            n *= e
        covered += n
        for off2, ext2 in boxes[:i]:
            if all(max(a, b) < min(a + x, b + y) for a, x, b, y in zip(off, ext, off2, ext2)) and n:
                return f"overlap ({off} + {ext} and {off2} + {ext2})"
    if covered != total:
        return f"cover {covered} of its {total} elements"
    return None


def write_index(directory: str, index: dict) -> None:
    # compact: json's C encoder, which an indent would bypass (3x slower on an index of 100 steps' metrics)
    text = json.dumps(index, sort_keys=True, separators=(",", ":")) + "\n"
    write_text(os.path.join(directory, INDEX), text, "the checkpoint index")


def commit_checkpoint(pending: PendingDirectory, reports: Iterable[dict], run_dir: str, keep: int, **fields) -> None:
    """A checkpoint whose files are all written (`reports`: its workers'): its index written last, the directory
    renamed into place, the run directory pruned to its newest `keep` complete checkpoints."""
    write_index(pending.path, build_index(FORMAT, reports, **fields))
    pending.commit()
    prune_checkpoints(run_dir, keep)


# ---------------------------------------------------------------------------------------------------
# Reading (workers on resume, the controller for final weights and tests)


def read_index(directory: str, fmt: str = FORMAT) -> dict:
    path = os.path.join(directory, INDEX)
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(path, "the index is missing (an incomplete checkpoint?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(path, f"cannot read the checkpoint index: {e}") from None
    if not isinstance(index, dict) or index.get("format") != fmt:
        raise CheckpointError(path, f"not a torch-backend index (format {fmt})")
    for k in ("files", "tensors"):
        if not isinstance(index.get(k), dict):
            raise CheckpointError(path, f"the checkpoint index has no '{k}'")
    for key, entry in index["tensors"].items():
        try:
            shards = [(s["offsets"], s["shape"]) for s in entry["shards"]]
            why = tiling_error(entry["shape"], shards)
            unknown = [s["file"] for s in entry["shards"] if s["file"] not in index["files"]]
        except (KeyError, TypeError):
            raise CheckpointError(path, f"the index entry of {key} is malformed") from None
        if why or unknown:
            raise CheckpointError(path, f"the index entry of {key} is broken: "
                                  f"{f'its shards {why}' if why else f'unknown file {unknown[0]}'}")
        if index_dtype(entry) is None:
            raise CheckpointError(path, f"{key} has dtype {entry.get('dtype')!r}, which is not a torch dtype")
    return index


def index_dtype(entry: dict) -> Optional[torch.dtype]:
    """The torch dtype an index entry names (e.g. "float32"), or None."""
    dtype = getattr(torch, str(entry.get("dtype")), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def verify_files(directory: str, index: dict) -> None:
    """Every shard file present with the size and SHA-256 the index records (reads each file once)."""
    for name, info in sorted(index["files"].items()):
        path = os.path.join(directory, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            raise CheckpointError(path, "a shard file of the checkpoint is missing") from None
        if size != info["bytes"]:
            raise CheckpointError(path, f"the shard file has {size} bytes, the index says {info['bytes']} "
                                  "(truncated or overwritten)")
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        if h.hexdigest() != info["sha256"]:
            raise CheckpointError(path, "the shard file is corrupted (its SHA-256 differs from the index)")


def intersect_box(a: Box, b: Box) -> Optional[Box]:
    lo = [max(x, y) for x, y in zip(a[0], b[0])]
    hi = [min(x + s, y + t) for x, s, y, t in zip(a[0], a[1], b[0], b[1])]
    if any(h < l for l, h in zip(lo, hi)):
        return None
    return tuple(lo), tuple(h - l for l, h in zip(lo, hi))


class Reader:
    """Reads boxes of the tensors of a checkpoint (or final-weights) directory from its shard files,
    assembling each from every shard that overlaps it (reshard on load); opens each file once."""

    def __init__(self, directory: str, fmt: str = FORMAT, index: Optional[dict] = None):
        self.directory = directory
        self.index = index if index is not None else read_index(directory, fmt)
        self._open: dict = {}
        self.bytes_read = 0

    def __contains__(self, key: str) -> bool:
        return key in self.index["tensors"]

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self.index["tensors"] if k.startswith(prefix)]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.index["tensors"][key]["shape"])

    def _file(self, name: str):
        f = self._open.get(name)
        if f is None:
            from safetensors import safe_open

            path = os.path.join(self.directory, name)
            try:
                f = safe_open(path, framework="pt", device="cpu")
            except FileNotFoundError:
                raise CheckpointError(path, "a shard file of the checkpoint is missing") from None
            except Exception as e:  # SafetensorError: a header that is not safetensors, a truncated file
                raise CheckpointError(path, f"the shard file is broken: {error_line(e)}") from None
            self._open[name] = f
        return f

    def read(self, key: str, box: Optional[Box] = None) -> torch.Tensor:
        """The part `box` (offsets, shape) of tensor `key`; the whole tensor without a box."""
        entry = self.index["tensors"].get(key)
        if entry is None:
            raise CheckpointError(os.path.join(self.directory, INDEX), f"the checkpoint has no tensor {key}")
        shape = tuple(entry["shape"])
        if box is None:
            box = ((0,) * len(shape), shape)
        dtype = index_dtype(entry)
        assert dtype is not None  # read_index checked every entry
        out = torch.empty(box[1], dtype=dtype)
        for s in entry["shards"]:
            ov = intersect_box(box, (tuple(s["offsets"]), tuple(s["shape"])))
            if ov is None or (ov[1] and 0 in ov[1]):
                continue
            path = os.path.join(self.directory, s["file"])
            f = self._file(s["file"])
            try:
                sl = f.get_slice(key)
                if list(sl.get_shape()) != list(s["shape"]):
                    raise CheckpointError(path, f"{key} has shape {sl.get_shape()} in the file, the index says {s['shape']}")
                src = tuple(slice(o - so, o - so + e) for o, e, so in zip(ov[0], ov[1], s["offsets"]))
                part = sl[src] if src else f.get_tensor(key)
            except CheckpointError:
                raise
            except Exception as e:
                raise CheckpointError(path, f"cannot read {key} from the shard file: {error_line(e)}") from None
            if part.dtype != dtype:
                raise CheckpointError(path, f"{key} is {part.dtype} in the file, the index says {entry['dtype']}")
            dst = tuple(slice(o - bo, o - bo + e) for o, e, bo in zip(ov[0], ov[1], box[0]))
            if dst:
                out[dst] = part
            else:
                out.copy_(part.reshape(()))
            self.bytes_read += part.numel() * part.element_size()
        if not finite_tensor(out):
            raise CheckpointError(os.path.join(self.directory, INDEX), f"{key} holds NaN or infinity, which no "
                                  "run writes (the file was changed); nothing non-finite is trained on or exported")
        return out

    def read_piece(self, key: str, piece: Piece) -> torch.Tensor:
        return self.read(key, piece_box(piece, self.shape(key)))

    def pieces(self, prefix: str, shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int, layers: int,
               convert: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> dict[str, torch.Tensor]:
        """This rank's pieces under `layout` of the tensors `prefix + name` (a model version), each `convert`ed as it
        is read."""
        return {n: convert(self.read_piece(prefix + n, piece))
                for n, piece in rank_pieces(shapes, layout, rank, layers).items()}


def load_full(directory: str, fmt: str = FORMAT) -> tuple[dict, dict[str, torch.Tensor]]:
    """(index, every tensor in full) of a checkpoint or final-weights directory (after verifying the files)."""
    index = read_index(directory, fmt)
    verify_files(directory, index)
    r = Reader(directory, fmt, index)
    return index, {k: r.read(k) for k in index["tensors"]}


def load_checkpoint(directory: str) -> dict:
    """A checkpoint in full, for inspection: {"step", "versions" {model: {v: {param: Tensor}}}, "optimizer"
    {model: {param: {state: Tensor}}}, "rng" {rank: Tensor}, "metrics", ...}."""
    index, tensors = load_full(directory, FORMAT)
    out = {k: v for k, v in index.items() if k not in ("files", "tensors")}
    out["metrics"] = {int(k): v for k, v in index.get("metrics", {}).items()}
    versions: dict = {}
    optimizer: dict = {}
    rng: dict = {}
    for key, t in tensors.items():
        kind, _, rest = key.partition("/")
        if kind == "weights":
            m, v, name = rest.split("/", 2)
            versions.setdefault(m, {}).setdefault(int(v[1:]), {})[name] = t
        elif kind == "adam":
            m, rest2 = rest.split("/", 1)
            name, state = rest2.rsplit("/", 1)
            optimizer.setdefault(m, {}).setdefault(name, {})[state] = t
        elif kind == "rng":
            rng[int(rest)] = t
    out.update(versions=versions, optimizer=optimizer, rng=rng)
    return out


def load_final(run_dir_or_final: str) -> dict[str, dict[str, torch.Tensor]]:
    """The final weights of a finished run: {model: {param: full float32 Tensor}}. Takes the run directory
    or its final/ directory."""
    directory = run_dir_or_final
    if not os.path.exists(os.path.join(directory, INDEX)) and os.path.isdir(final_path(directory)):
        directory = final_path(directory)
    _, tensors = load_full(directory, FINAL_FORMAT)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        kind, _, rest = key.partition("/")
        if kind == "weights":
            m, name = rest.split("/", 1)
            out.setdefault(m, {})[name] = t
    return out


def find_resume_checkpoint(run_dir: str, identity: dict, plan: RunPlan) -> tuple[str, dict]:
    """The latest complete checkpoint in `run_dir`, checked against the run being resumed (its identity,
    not its plan: a checkpoint resumes under any plan of the same run). Removes what an interrupted
    checkpoint left; checks every shard file's size and SHA-256."""
    final = final_path(run_dir)
    if os.path.exists(os.path.join(final, INDEX)):
        try:
            done = read_index(final, FINAL_FORMAT)
        except CheckpointError:
            done = None
        if done is not None and done.get("identity") == identity:
            raise RpegError(Loc(final, 0, 0), "this run already finished (its final weights are here); "
                            "nothing to resume")
    remove_partials(run_dir)
    found = complete_checkpoints(run_dir)
    if not found:
        raise RpegError(Loc(run_dir, 0, 0), "no checkpoint to resume from (expected checkpoints/step-NNNNNN/); "
                        "run with --run-dir DIR --checkpoint-every N first")
    damaged: list[tuple[str, CheckpointError]] = []
    for _, path in reversed(found):  # the newest intact one
        try:
            index = _intact(path)
        except CheckpointError as e:
            damaged.append((os.path.basename(path), e))
            continue
        why = identity_difference(index.get("identity", {}), identity)
        if why:
            raise CheckpointError(os.path.join(path, INDEX), f"the checkpoint belongs to another run: {why}; "
                                  "resume with the program, seed and options the run started with")
        if index["step"] >= plan.steps:
            raise CheckpointError(path, f"the checkpoint is at step {index['step']}, the run has {plan.steps} "
                                  "step(s): nothing left to resume")
        if damaged:
            warn(f"resuming from {os.path.basename(path)}, the newest intact checkpoint; "
                 + "; ".join(_damage(name, e) for name, e in damaged))
        return path, index
    if len(damaged) == 1:
        raise damaged[0][1]
    raise RpegError(Loc(run_dir, 0, 0), "no intact checkpoint to resume from: "
                    + "; ".join(_damage(name, e) for name, e in damaged))


def _damage(name: str, e: CheckpointError) -> str:
    return f"{name} is damaged ({e.loc.file}: {e.message})"


def _intact(path: str) -> dict:
    """The index of checkpoint `path` after checking its step and every shard file's size and SHA-256."""
    index = read_index(path, FORMAT)
    step = index.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise CheckpointError(os.path.join(path, INDEX), "the checkpoint index has no valid step")
    verify_files(path, index)
    return index


def resume_plan(plan: RunPlan, step: int) -> RunPlan:
    """The plan restricted to the nodes of steps >= `step` (`RunPlan.from_step`)."""
    return plan.from_step(step)


def assemble(shapes: dict[str, tuple[int, ...]], layers: int, layout: Layout,
             shards: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full tensors from the shards of the ranks of replica 0 of `layout` (every piece once)."""
    full = {n: torch.empty(s) for n, s in shapes.items()}
    for r in layout.replica(0):
        for name, piece in rank_pieces(shapes, layout, r, layers).items():
            dst = full[name] if piece.dim is None else full[name].narrow(piece.dim, piece.lo, piece.hi - piece.lo)
            dst.copy_(shards[r][name])
    return full


def kept_versions(step: int, tau: int) -> range:
    """Versions of a model with staleness `tau` that nodes of steps >= `step` may read."""
    return range(max(0, step - tau), step + 1)


__all__ = ["FORMAT", "FINAL_FORMAT", "FINAL", "INDEX", "CheckpointError", "Reader", "clear_run_dir",
           "checkpoint_path", "final_path", "latest_checkpoint", "complete_checkpoints", "prune_checkpoints",
           "remove_partials", "load_checkpoint", "load_final", "find_resume_checkpoint", "resume_plan",
           "kept_versions", "assemble", "run_identity", "identity_difference", "write_shard_file", "build_index",
           "write_index", "commit_checkpoint", "read_index", "verify_files", "piece_box", "tiling_error"]
