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
/// instance or several — is settled by JetStream alone: exactly one publish of a message id
/// is acknowledged as new, the others as duplicates, and the answers follow the acks, whichever
/// reaches the ledger first (a duplicate's row, written first with `accepted` 0, is completed
/// by the new one's). So exactly one request is told its batch was new, and the duplicate
/// batch is counted once.
///
/// Only the existing schema is used (`batches` with the sending device, `streams`, `counters`
/// of `Store.schema`).
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
    /// Returns whether this request's batch was new: never for a duplicate ack (which counts one
    /// duplicate batch); for a new ack unless the key was recorded as new before (a re-send
    /// after the duplicate window, counted as a duplicate). A row a duplicate ack wrote first
    /// (`accepted` 0) is taken over by the new ack.
    @discardableResult
    func ledgerRecord(
        key: String, stream: String, receivedAt: Int64, records: Int, duplicate: Bool, deviceId: String? = nil
    ) throws(StoreError) -> Bool {
        try transaction(.readCommitted) { () throws(StoreError) -> Bool in
            try db.run("INSERT INTO streams (name) VALUES (?) ON CONFLICT (name) DO NOTHING", [.text(stream)])
            let fresh =
                try db.run(
                    """
                    INSERT INTO batches (key, stream, received_at, record_count, accepted, device_id)
                    SELECT ?, id, ?, ?, ?, ? FROM streams WHERE name = ?
                    ON CONFLICT (key) DO UPDATE SET received_at = excluded.received_at, accepted = excluded.accepted,
                        device_id = excluded.device_id
                    WHERE batches.accepted = 0 AND excluded.accepted > 0
                    """,
                    [
                        .text(key), .int(receivedAt), .int(Int64(records)), .int(duplicate ? 0 : Int64(records)),
                        deviceId.map { .text($0) } ?? .null, .text(stream),
                    ]) > 0
            if duplicate || !fresh { try ledgerBump(stream, "duplicateBatches") }
            return fresh && !duplicate
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
