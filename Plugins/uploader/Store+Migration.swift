import PylonCore
import PylonStore

/// Format 1 → 2: the earlier releases' queue held one row per record in `records` (with a
/// (stream, id) unique index and a (stream, batch, seq) index). At open, every such row is
/// moved into chunks, in one transaction, and the table is dropped:
///
/// - order is kept: records are read by `seq`, and a stream's run of records with the same batch
///   and switch becomes one chunk (at most `migrationChunkRecords`), positioned in that order;
/// - a record that was in a cut batch goes into a chunk of that batch, so the pending batch keeps
///   its key and its records: its resend is still recognised by the backend as a duplicate;
/// - ids are written JSON-escaped as the batch body needs them; `data` is copied as stored;
/// - the dropped table's pages are zeroed as they are freed (`secure_delete=ON`).
///
/// A crash during the migration rolls it back; the next start migrates again.
extension UploaderStore {
    /// Chunks made from an old queue hold at most this many records (a batch's maximum).
    static let migrationChunkRecords = StreamSettings.maxCountLimit

    func migrateRecordsTable() throws(SQLiteError) {
        guard try db.query("SELECT name FROM sqlite_master WHERE type='table' AND name='records'").first != nil else { return }
        try db.transaction { () throws(SQLiteError) in
            struct Run {
                var consent: String
                var batch: String?
                var enqueuedMs: Int64
                var first: Int64
                var chunk = Chunk()
            }
            var open: [String: Run] = [:]
            var position: Int64 = try db.query("SELECT COALESCE(MAX(first + count), 0) FROM chunks").first?[0].int ?? 0
            var escaped: [UInt8] = []
            func flush(_ stream: String) throws(SQLiteError) {
                guard let r = open.removeValue(forKey: stream), !r.chunk.isEmpty else { return }
                try insertChunk(stream: stream, consent: r.consent, first: r.first, r.chunk, batch: r.batch, nowMs: r.enqueuedMs)
            }
            let rows = try db.prepare("SELECT stream, consent, id, ts, body, batch, enqueued_ms FROM records ORDER BY seq")
            // Streamed: the SELECT reads `records` while chunks are written to another table.
            while try rows.step() {
                let stream = rows.text(0), consent = rows.text(1), batch = rows.value(5).text
                if let r = open[stream], r.consent != consent || r.batch != batch || r.chunk.count >= UploaderStore.migrationChunkRecords {
                    try flush(stream)
                }
                if open[stream] == nil { open[stream] = Run(consent: consent, batch: batch, enqueuedMs: rows.int(6), first: position) }
                escaped.removeAll(keepingCapacity: true)
                rows.withText(2) { JSONText.appendString($0, to: &escaped) }
                let ts = rows.int(3)
                escaped.withUnsafeBytes { id in rows.withText(4) { d in _ = open[stream]!.chunk.append(escapedID: id, ts: ts, data: d) } }
                position += 1
            }
            rows.reset()
            for stream in Array(open.keys) { try flush(stream) }
            // The old rows' pages are zeroed as they are freed: the records live on in the
            // chunks, and a copy left in free pages would outlive a later purge (consent denied).
            try zeroFreedPages(true)
            try db.exec("DROP TABLE records")
        }
        try zeroFreedPages(false)
    }
}
