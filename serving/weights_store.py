"""The experiment file and the weights changed at run time, kept across restarts.

Weights set through the admin endpoint go to a state file next to the experiment file
(``experiments.yaml`` → ``experiments.state.json``), written atomically (a temporary file,
fsync, rename), so a crash leaves either the old weights or the new ones. The operator's
file keeps its comments and stays the source of everything else. At start the state applies
only to the experiment it was written for: same experiment name, same variants, and the
file's weights unchanged since; an operator who edits the file's weights, or starts a new
experiment, gets what the file says.

The state also keeps the weight epoch, which records carry: it only grows. Weights from the
file after a change of the file start the epoch after the saved one, so an epoch never
stands for two different sets of weights while the state file lives.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, TypeGuard

import orjson

from inferwatch.serving.split import ExperimentFile, ExperimentSpec, Split, parse_experiments

log = logging.getLogger(__name__)


def state_path(experiment_file: Path) -> Path:
    return experiment_file.with_suffix(".state.json")


def load_splits(experiment_file: Path) -> dict[str, Split]:
    """The experiments of the file, with the weights the state file kept where it applies."""
    spec = parse_experiments(experiment_file.read_text(), str(experiment_file))
    saved = _read_state(state_path(experiment_file))
    return {model: split_from_state(model, exp, saved.get(model), str(state_path(experiment_file)),
                                    str(experiment_file))[0]
            for model, exp in spec.experiments.items()}


def split_from_state(model: str, exp: ExperimentSpec, entry: object, where: str, source: str) -> tuple[Split, bool]:
    """The split to start with from saved state ``entry`` (from the state file or Redis), and
    whether the entry applied: only to the same experiment, variants and file weights."""
    names = [v.name for v in exp.variants]
    file_weights = [v.weight for v in exp.variants]
    if (isinstance(entry, dict) and entry.get("experiment") == exp.name and entry.get("variants") == names
            and entry.get("file_weights") == file_weights and _weights_ok(entry.get("weights"), len(names))):
        split = Split.of(model, exp, tuple(entry["weights"]), _epoch(entry))
        log.warning("experiment %s (model %s): weights %s, epoch %d, from %s", exp.name, model, _show(split),
                    split.epoch, where)
        return split, True
    same = isinstance(entry, dict) and entry.get("experiment") == exp.name
    split = Split.of(model, exp, epoch=_epoch(entry) + 1 if same else 0)
    if entry is not None:  # say so: a rollback kept in the state would otherwise vanish silently
        weights = entry.get("weights") if isinstance(entry, dict) else None
        log.warning("experiment %s (model %s): saved weights %s (experiment %s) not applied: the file's "
                    "experiment, variants or weights changed since; weights %s from %s", exp.name, model,
                    ", ".join(f"{w:g}" for w in weights) if isinstance(weights, list) and _weights_ok(weights, len(weights))
                    else "?",
                    entry.get("experiment") if isinstance(entry, dict) else "?", _show(split), source)
    return split, False


def running_state(entry: object, split: Split) -> tuple[tuple[float, ...], int] | None:
    """The weights and epoch ``entry`` sets for a running ``split``: any entry of the same
    experiment and variants, whatever file weights it started from (replicas mid-way through a
    rollout of an edited file still route alike); None for anything else, an entry whose
    epoch is not a count included."""
    epoch = entry.get("epoch") if isinstance(entry, dict) else None
    if (isinstance(entry, dict) and entry.get("experiment") == split.name
            and entry.get("variants") == [v.name for v in split.variants]
            and _weights_ok(entry.get("weights"), len(split.variants))
            and isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0):
        return tuple(float(w) for w in entry["weights"]), epoch
    return None


def foreign(entry: object, split: Split) -> TypeGuard[dict[str, Any]]:
    """A well-formed entry of another experiment or other variants under this model: a replica
    with another experiment file wrote it."""
    return (isinstance(entry, dict) and isinstance(entry.get("experiment"), str) and isinstance(entry.get("variants"), list)
            and (entry["experiment"] != split.name or entry["variants"] != [v.name for v in split.variants]))


def state_entry(split: Split, exp: ExperimentSpec) -> dict:
    """What is kept of ``split`` (file ``exp``): enough to tell, at the next start, whether it still applies."""
    return {"experiment": split.name, "variants": [v.name for v in split.variants],
            "file_weights": [v.weight for v in exp.variants], "weights": list(split.weights),
            "epoch": split.epoch, "saved_at": time.time()}


def save_weights(experiment_file: Path, splits: dict[str, Split]) -> None:
    """Write every experiment's current weights (atomically; raises OSError on failure)."""
    spec: ExperimentFile = parse_experiments(experiment_file.read_text(), str(experiment_file))
    doc = {}
    for model, split in splits.items():
        exp = spec.experiments.get(model)
        if exp is None or exp.name != split.name:
            continue  # the file moved on since the gateway started: its next start uses the file
        doc[model] = state_entry(split, exp)
    target = state_path(experiment_file)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_state(path: Path) -> dict:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        log.error("ignoring the experiment state file %s: %s", path, exc)
        return {}
    return doc if isinstance(doc, dict) else {}


def _weights_ok(weights: object, n: int) -> bool:
    return (isinstance(weights, list) and len(weights) == n
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w <= 1 for w in weights)
            and abs(sum(weights) - 1) <= 1e-6)


def _epoch(entry: object) -> int:
    epoch = entry.get("epoch") if isinstance(entry, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else 0


def _show(split: Split) -> str:
    return ", ".join(f"{v.name}={w:g}" for v, w in zip(split.variants, split.weights))


def describe_change(split: Split, new: Split) -> str:
    return (f"experiment {split.name} (model {split.model}): weights {_show(split)} -> {_show(new)}, "
            f"epoch {split.epoch} -> {new.epoch}")

