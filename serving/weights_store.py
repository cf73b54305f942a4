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

import orjson

from inferwatch.serving.split import ExperimentFile, Split, parse_experiments

log = logging.getLogger(__name__)


def state_path(experiment_file: Path) -> Path:
    return experiment_file.with_suffix(".state.json")


def load_splits(experiment_file: Path) -> dict[str, Split]:
    """The experiments of the file, with the weights the state file kept where it applies."""
    spec = parse_experiments(experiment_file.read_text(), str(experiment_file))
    saved = _read_state(state_path(experiment_file))
    splits: dict[str, Split] = {}
    for model, exp in spec.experiments.items():
        names = [v.name for v in exp.variants]
        file_weights = [v.weight for v in exp.variants]
        entry = saved.get(model)
        if (isinstance(entry, dict) and entry.get("experiment") == exp.name and entry.get("variants") == names
                and entry.get("file_weights") == file_weights and _weights_ok(entry.get("weights"), len(names))):
            splits[model] = Split.of(model, exp, tuple(entry["weights"]), _epoch(entry))
            log.warning("experiment %s (model %s): weights %s from %s", exp.name, model,
                        _show(splits[model]), state_path(experiment_file))
        else:
            same = isinstance(entry, dict) and entry.get("experiment") == exp.name
            splits[model] = Split.of(model, exp, epoch=_epoch(entry) + 1 if same else 0)
            if entry is not None:  # say so: a rollback kept in the state file would otherwise vanish silently
                weights = entry.get("weights") if isinstance(entry, dict) else None
                log.warning("experiment %s (model %s): saved weights %s (experiment %s) not applied: the file's "
                            "experiment, variants or weights changed since; weights %s from %s", exp.name, model,
                            ", ".join(f"{w:g}" for w in weights) if isinstance(weights, list) and _weights_ok(weights, len(weights))
                            else "?",
                            entry.get("experiment") if isinstance(entry, dict) else "?", _show(splits[model]),
                            experiment_file)
    return splits


def save_weights(experiment_file: Path, splits: dict[str, Split]) -> None:
    """Write every experiment's current weights (atomically; raises OSError on failure)."""
    spec: ExperimentFile = parse_experiments(experiment_file.read_text(), str(experiment_file))
    doc = {}
    for model, split in splits.items():
        exp = spec.experiments.get(model)
        if exp is None or exp.name != split.name:
            continue  # the file moved on since the gateway started: its next start uses the file
        doc[model] = {"experiment": split.name, "variants": [v.name for v in split.variants],
                      "file_weights": [v.weight for v in exp.variants], "weights": list(split.weights),
                      "epoch": split.epoch, "saved_at": time.time()}
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

