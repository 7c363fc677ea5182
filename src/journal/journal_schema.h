// The journal's SQLite schema: the version, the table and its indexes, the
// migration from each older version, and the column list rows are read in
// (read_row's order). Private to journal.cpp, kept apart so that the SQL the
// file format is made of reads in one place.
#pragma once

#include <iterator>

namespace spw::journal::schema {

// 2: `admission`, the admission decision as a JSON document (NULL: none).
// 3: `checkpoint` (opaque bytes a resume continues from; NULL: none) and
//    `checkpoint_tokens` (the generated tokens it holds).
// 4: `public_id` (random, unique: what clients see), `owner`, idempotency
//    keys unique per owner instead of globally, the body's size and digest
//    (`body_bytes`, `body_sha256`) and whether it is kept (`body_kept`),
//    `refusal_reason`, and the response fields a replay needs (`seed`,
//    `queue_ms`, `run_ms`, `max_tokens_requested`).
// 5: `choices`, the choices after the first of a request with n > 1
//    (encode_choices; '' for n = 1).
inline constexpr int kSchemaVersion = 5;

// One table: a request is one row whose state moves forward; the attempt
// counter says how often an idempotency key was run. The key's uniqueness is
// an index per owner (a NULL key, none, is never looked up); public ids are
// unique so that get_public() names one row.
inline constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS requests (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  idempotency_key TEXT,
  endpoint TEXT NOT NULL,
  body TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 1,
  placement TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  resumable INTEGER NOT NULL DEFAULT 0,
  finish_reason TEXT NOT NULL DEFAULT '',
  text TEXT NOT NULL DEFAULT '',
  prompt_tokens INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  error_code TEXT NOT NULL DEFAULT '',
  error_message TEXT NOT NULL DEFAULT '',
  admission TEXT,
  checkpoint BLOB,
  checkpoint_tokens INTEGER NOT NULL DEFAULT 0,
  public_id INTEGER NOT NULL,
  owner TEXT NOT NULL DEFAULT '',
  body_bytes INTEGER NOT NULL DEFAULT 0,
  body_sha256 TEXT NOT NULL DEFAULT '',
  body_kept INTEGER NOT NULL DEFAULT 1,
  refusal_reason TEXT NOT NULL DEFAULT '',
  seed INTEGER,
  queue_ms REAL NOT NULL DEFAULT 0,
  run_ms REAL NOT NULL DEFAULT 0,
  max_tokens_requested INTEGER,
  choices TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS requests_state ON requests(state);
CREATE UNIQUE INDEX IF NOT EXISTS requests_public_id ON requests(public_id);
CREATE UNIQUE INDEX IF NOT EXISTS requests_owner_key ON requests(owner, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS equivalence (
  key TEXT PRIMARY KEY,
  passed INTEGER NOT NULL,
  detail TEXT NOT NULL,
  ms REAL NOT NULL,
  checked_ms INTEGER NOT NULL
);
)sql";

// kMigrations[v - 1] turns a version-v journal into version v + 1, in place:
// a user upgrading Spillway keeps their journal (and its idempotency keys).
// Run inside open()'s transaction, so a failed step leaves the file as it was.
inline constexpr const char* kMigrations[] = {
    // 1 -> 2: existing rows have no recorded decision.
    "ALTER TABLE requests ADD COLUMN admission TEXT",
    // 2 -> 3: existing rows have no checkpoint (an interrupted one resumes by
    // running again from the start, as before).
    "ALTER TABLE requests ADD COLUMN checkpoint BLOB; "
    "ALTER TABLE requests ADD COLUMN checkpoint_tokens INTEGER NOT NULL DEFAULT 0",
    // 3 -> 4: the UNIQUE constraint on idempotency_key becomes an index per
    // owner. SQLite cannot drop a column constraint, so the table is rebuilt
    // as its documented ALTER TABLE procedure does (create the new table,
    // copy every row with its id, drop the old one, rename; no views,
    // triggers or foreign keys refer to it). The version-4 table is spelt out
    // here, not taken from kSchema, which later versions change. The
    // AUTOINCREMENT counter moves to the new table (DROP TABLE would delete
    // it and RENAME carries it over), so ids of pruned rows stay unused.
    // Copied rows have owner '' (no keys existed) and a placeholder public id
    // -id (unique, never a real one) that open() replaces with a random one,
    // filling in the body's size and digest too (complete_migrated_rows_locked:
    // Env's random numbers and SHA-256 are not SQL). kSchema then creates the
    // indexes (DROP TABLE dropped requests_state).
    R"sql(
CREATE TABLE requests_v4 (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  idempotency_key TEXT,
  endpoint TEXT NOT NULL,
  body TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 1,
  placement TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  resumable INTEGER NOT NULL DEFAULT 0,
  finish_reason TEXT NOT NULL DEFAULT '',
  text TEXT NOT NULL DEFAULT '',
  prompt_tokens INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  error_code TEXT NOT NULL DEFAULT '',
  error_message TEXT NOT NULL DEFAULT '',
  admission TEXT,
  checkpoint BLOB,
  checkpoint_tokens INTEGER NOT NULL DEFAULT 0,
  public_id INTEGER NOT NULL,
  owner TEXT NOT NULL DEFAULT '',
  body_bytes INTEGER NOT NULL DEFAULT 0,
  body_sha256 TEXT NOT NULL DEFAULT '',
  body_kept INTEGER NOT NULL DEFAULT 1,
  refusal_reason TEXT NOT NULL DEFAULT '',
  seed INTEGER,
  queue_ms REAL NOT NULL DEFAULT 0,
  run_ms REAL NOT NULL DEFAULT 0,
  max_tokens_requested INTEGER
);
INSERT INTO requests_v4 (id, idempotency_key, endpoint, body, state, attempts, placement, created_ms, updated_ms,
                         resumable, finish_reason, text, prompt_tokens, completion_tokens, error_code, error_message,
                         admission, checkpoint, checkpoint_tokens, public_id)
  SELECT id, idempotency_key, endpoint, body, state, attempts, placement, created_ms, updated_ms, resumable,
         finish_reason, text, prompt_tokens, completion_tokens, error_code, error_message, admission, checkpoint,
         checkpoint_tokens, -id
  FROM requests;
DELETE FROM sqlite_sequence WHERE name = 'requests_v4';
UPDATE sqlite_sequence SET name = 'requests_v4' WHERE name = 'requests';
DROP TABLE requests;
ALTER TABLE requests_v4 RENAME TO requests;
)sql",
    // 4 -> 5: existing rows are n = 1 requests.
    "ALTER TABLE requests ADD COLUMN choices TEXT NOT NULL DEFAULT ''",
};
static_assert(std::size(kMigrations) == kSchemaVersion - 1, "one migration per older schema version");

inline constexpr const char* kColumns =
    "id, idempotency_key, endpoint, body, state, attempts, placement, created_ms, updated_ms, resumable, "
    "finish_reason, text, prompt_tokens, completion_tokens, error_code, error_message, admission, checkpoint, "
    "checkpoint_tokens, public_id, owner, body_bytes, body_sha256, body_kept, refusal_reason, seed, queue_ms, "
    "run_ms, max_tokens_requested, choices";

}  // namespace spw::journal::schema
