"""SQLite persistence: every acknowledged batch and rating, the baselines, and checkpoints of
the experiment ledgers.

Batches are stored as received (one row per batch, written before the ingest is answered)
in WAL mode with synchronous=NORMAL: a committed transaction survives the process being
killed (-9) because it is in the OS page cache and the WAL; only a power loss before the
next checkpoint could lose the last commits. Windows are rebuilt from these rows on start; experiment ledgers from their
last checkpoint
and the batches and ratings stored after it.

Checkpoints (which fsync) run on a background thread with its own connection instead of
inside whichever insert crosses SQLite's auto-checkpoint size, so ingest latency does not
carry them.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY,
    received_at REAL NOT NULL,
    min_t REAL NOT NULL,
    max_t REAL NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_max_t ON batches (max_t);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS ratings (
    id INTEGER PRIMARY KEY,
    received_at REAL NOT NULL,
    body BLOB NOT NULL
);
-- the Idempotency-Key of each stored batch: a batch sent again (its first try's answer was
-- lost) is stored once
CREATE TABLE IF NOT EXISTS batch_keys (
    key TEXT PRIMARY KEY,
    batch_id INTEGER NOT NULL
);
-- the answers rated: each counts once, whichever way its rating came and however often
CREATE TABLE IF NOT EXISTS rated (
    response_id TEXT PRIMARY KEY,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledgers (
    model TEXT NOT NULL,
    experiment TEXT NOT NULL,
    blob BLOB NOT NULL,
    PRIMARY KEY (model, experiment)
);
-- the segment's verdict per time bucket (the report's history and drifting_since): a
-- restarted replica goes on from its own past instead of forgetting when a drift began
CREATE TABLE IF NOT EXISTS history (
    model TEXT NOT NULL,
    variant TEXT NOT NULL,
    t REAL NOT NULL,
    point BLOB NOT NULL,
    PRIMARY KEY (model, variant, t)
);
CREATE TABLE IF NOT EXISTS baselines (
    model TEXT NOT NULL,
    variant TEXT NOT NULL,
    created_at REAL NOT NULL,
    doc BLOB NOT NULL,
    PRIMARY KEY (model, variant)
);
"""


class Store:
    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if str(path) != ":memory:":
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, args=(str(path),), daemon=True,
                                                  name="sqlite-checkpoint")
            self._checkpointer.start()

    def _checkpoint_loop(self, path: str, every_s: float = 2.0) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            while not self._stop.wait(every_s):
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    def append(self, body: bytes, min_t: float, max_t: float, received_at: float, key: str | None = None
               ) -> int | None:
        """The new batch's id; None when a batch under ``key`` is stored already."""
        with self._lock:
            if key is None:
                return self._insert_batch(body, min_t, max_t, received_at)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self._db.execute("SELECT 1 FROM batch_keys WHERE key = ?", (key,)).fetchone():
                    self._db.execute("ROLLBACK")
                    return None
                batch_id = self._insert_batch(body, min_t, max_t, received_at)
                self._db.execute("INSERT INTO batch_keys (key, batch_id) VALUES (?, ?)", (key, batch_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return batch_id

    def _insert_batch(self, body: bytes, min_t: float, max_t: float, received_at: float) -> int:
        cur = self._db.execute("INSERT INTO batches (received_at, min_t, max_t, body) VALUES (?, ?, ?, ?)",
                               (received_at, min_t, max_t, body))
        assert cur.lastrowid is not None  # set by an INSERT
        return cur.lastrowid

    def batches(self, since: float, until: float = float("inf")) -> Iterator[bytes]:
        """Bodies of batches holding any record finished in [since, until]."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM batches WHERE max_t >= ? AND min_t <= ? ORDER BY id",
                                    (since, until if until != float("inf") else 1e300)).fetchall()
        for (body,) in rows:
            yield body

    def batches_for_restore(self, since: float, after_id: int) -> Iterator[tuple[int, float, bytes]]:
        """(id, received_at, body) of batches holding a record finished at or after ``since``
        (the window's) or stored after batch ``after_id`` (the ledgers' checkpoint), in order."""
        with self._lock:
            rows = self._db.execute("SELECT id, received_at, body FROM batches WHERE max_t >= ? OR id > ? ORDER BY id",
                                    (since, after_id)).fetchall()
        yield from rows

    def prune(self, before: float) -> int:
        with self._lock:
            self._db.execute("DELETE FROM ratings WHERE received_at < ?", (before,))
            self._db.execute("DELETE FROM rated WHERE received_at < ?", (before,))
            self._db.execute("DELETE FROM history WHERE t < ?", (before,))
            pruned = self._db.execute("DELETE FROM batches WHERE max_t < ?", (before,)).rowcount
            self._db.execute("DELETE FROM batch_keys WHERE batch_id NOT IN (SELECT id FROM batches)")
            return pruned

    def first_ratings(self, response_ids: list[str], received_at: float) -> set[str]:
        """Of ``response_ids``, those not rated before (now marked rated)."""
        with self._lock:
            return {rid for rid in response_ids
                    if self._db.execute("INSERT OR IGNORE INTO rated (response_id, received_at) VALUES (?, ?)",
                                        (rid, received_at)).rowcount}

    def append_ratings(self, body: bytes, received_at: float) -> int:
        with self._lock:
            cur = self._db.execute("INSERT INTO ratings (received_at, body) VALUES (?, ?)", (received_at, body))
            assert cur.lastrowid is not None  # set by an INSERT
            return cur.lastrowid

    def ratings_after(self, after_id: int) -> list[tuple[int, float, bytes]]:
        with self._lock:
            return self._db.execute("SELECT id, received_at, body FROM ratings WHERE id > ? ORDER BY id",
                                    (after_id,)).fetchall()

    def checkpoint_ledgers(self, blobs: dict[tuple[str, str], bytes], gone: list[tuple[str, str]],
                           upto: tuple[int, int]) -> None:
        """Changed ledgers, dropped ones, and the last batch and rating ids they include: one
        transaction, so a crash leaves the previous checkpoint or this one."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT OR REPLACE INTO ledgers (model, experiment, blob) VALUES (?, ?, ?)",
                                     [(m, e, b) for (m, e), b in blobs.items()])
                self._db.executemany("DELETE FROM ledgers WHERE model = ? AND experiment = ?", gone)
                self._db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES ('ledgers_upto', ?)",
                                 (orjson.dumps(list(upto)),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def ledgers(self) -> tuple[list[bytes], tuple[int, int]]:
        """The checkpointed ledgers and the (batch id, rating id) they include."""
        with self._lock:
            blobs = [b for (b,) in self._db.execute("SELECT blob FROM ledgers").fetchall()]
            row = self._db.execute("SELECT value FROM settings WHERE key = 'ledgers_upto'").fetchone()
        upto = orjson.loads(row[0]) if row else [0, 0]
        return blobs, (int(upto[0]), int(upto[1]))

    def put_baseline(self, model: str, variant: str, doc: dict[str, Any], created_at: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO baselines (model, variant, created_at, doc) VALUES (?, ?, ?, ?)",
                             (model, variant, created_at, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)))

    def baselines(self) -> dict[tuple[str, str], dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT model, variant, doc FROM baselines").fetchall()
        return {(m, v): orjson.loads(doc) for m, v, doc in rows}

    def put_history(self, model: str, variant: str, t: float, point: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO history (model, variant, t, point) VALUES (?, ?, ?, ?)",
                             (model, variant, t, orjson.dumps(point)))

    def forget_history(self, model: str, variant: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM history WHERE model = ? AND variant = ?", (model, variant))

    def history(self) -> dict[tuple[str, str], list[tuple[float, dict[str, Any]]]]:
        """Each segment's points, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT model, variant, t, point FROM history ORDER BY t").fetchall()
        out: dict[tuple[str, str], list[tuple[float, dict[str, Any]]]] = {}
        for model, variant, t, point in rows:
            out.setdefault((model, variant), []).append((t, orjson.loads(point)))
        return out

    def put_setting(self, key: str, value: object) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, orjson.dumps(value)))

    def setting(self, key: str, default: object = None) -> object:
        with self._lock:
            row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return default if row is None else orjson.loads(row[0])

    def close(self) -> None:
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=5)
        with self._lock:
            self._db.close()
