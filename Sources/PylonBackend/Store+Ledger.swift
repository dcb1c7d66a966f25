import PylonStore

/// The ingest ledger of NATS mode (`--nats`): the batches live in the JetStream stream, the
/// database keeps only their keys and counters — one `batches` row per acknowledged batch
/// (key, stream, time received, record count; `accepted` = the records published, 0 for a
/// duplicate) and the `duplicateBatches` counter. No `records` rows are written in this mode.
///
/// JetStream's duplicate window (2 minutes by default) drops a re-sent batch only within that
/// window; the ledger makes the key's idempotency as long-lived as the database. The order
/// never loses an acknowledged batch: a key is recorded only after JetStream acknowledged it
/// (`ledgerRecord`), and a key found recorded (`ledgerSeen`) is answered as a duplicate
/// without publishing. The one race — two requests with one key in flight at once, on one
/// instance or several — is settled by JetStream (the second is acknowledged as a duplicate)
/// and by the unique key (the second insert is a no-op).
///
/// Only the existing schema is used (`batches`, `streams`, `counters` of `Store.schema`).
extension Store {
    /// True, counting one duplicate batch for `stream`, when `key` was recorded before.
    func ledgerSeen(_ key: String, stream: String) throws(StoreError) -> Bool {
        try transaction(.readCommitted) { () throws(StoreError) -> Bool in
            guard !(try db.query("SELECT 1 FROM batches WHERE key = ?", [.text(key)])).isEmpty else { return false }
            try ledgerBump(stream, "duplicateBatches")
            return true
        }
    }

    /// Records an acknowledged batch. `duplicate`: JetStream reported it already stored.
    /// Returns false when the key was already recorded; a duplicate either way counts one
    /// duplicate batch. The unique key settles two instances recording one key at once.
    @discardableResult
    func ledgerRecord(key: String, stream: String, receivedAt: Int64, records: Int, duplicate: Bool) throws(StoreError) -> Bool {
        try transaction(.readCommitted) { () throws(StoreError) -> Bool in
            try db.run("INSERT INTO streams (name) VALUES (?) ON CONFLICT (name) DO NOTHING", [.text(stream)])
            let fresh =
                try db.run(
                    """
                    INSERT INTO batches (key, stream, received_at, record_count, accepted)
                    SELECT ?, id, ?, ?, ? FROM streams WHERE name = ?
                    ON CONFLICT (key) DO NOTHING
                    """,
                    [.text(key), .int(receivedAt), .int(Int64(records)), .int(duplicate ? 0 : Int64(records)), .text(stream)]) > 0
            if duplicate || !fresh { try ledgerBump(stream, "duplicateBatches") }
            return fresh
        }
    }

    private func ledgerBump(_ stream: String, _ name: String) throws(StoreError) {
        try db.run(
            """
            INSERT INTO counters (stream, name, value) VALUES (?, ?, 1)
            ON CONFLICT (stream, name) DO UPDATE SET value = counters.value + 1
            """, [.text(stream), .text(name)])
    }
}
