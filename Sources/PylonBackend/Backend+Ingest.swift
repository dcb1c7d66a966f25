import PylonCore
import PylonStore

/// Ingest in NATS mode (`--nats`): each accepted batch is published to the JetStream ingest
/// stream and answered once JetStream acknowledged it (`Disposition.later`). The order, and
/// what the database keeps, are described in `Store+Ledger.swift`; the stream's format in
/// docs/FLEET.md "Ingest stream (JetStream)".
///
/// 1. The request is validated as without NATS (key, encoding, batch shape: 400/413/415).
/// 2. A key already in the ledger is answered as a duplicate at once, without publishing.
/// 3. Not connected, or the stream not ready: 503 `stream_unavailable`, Retry-After: 1.
///    `--nats-max-pending` publishes waiting for acks: 503 `server_busy`, Retry-After: 1.
/// 4. Published as posted (after `Content-Encoding`), `Nats-Msg-Id` = the key. On the ack the
///    key is recorded, then the device is answered (a duplicate ack: answered as a duplicate).
///    No ack within `--nats-ack-timeout-ms`, or a JetStream error: 503 `stream_unavailable`,
///    Retry-After: 1; an ack arriving later still records the key.
extension Backend {
    func ingestToStream(
        _ request: HTTPRequest, stream: String, _ js: JetStreamPublisher, _ principal: Principal, into answer: DeferredAnswer
    ) throws(APIError) -> Disposition {
        let key = try idempotencyKey(request)
        let body = try decodedBody(request)
        let batch = try Batch.parse(body, key: key, stream: stream)
        let records = batch.records.count
        if try storage({ () throws(StoreError) in try store.ledgerSeen(key, stream: stream) }) {
            log.debug("batch: key already recorded", ["stream": stream, "key": key])
            return .respond(Backend.ingestAnswer(accepted: 0, duplicates: records, duplicateBatch: true, seq: nil), delayMs: 0)
        }
        let receivedAt = System.wallClockMs()
        let subject = JetStreamWire.subject(prefix: js.settings.stream.subjectPrefix, stream: stream)
        var headers = JetStreamWire.headers(
            stream: stream, receivedAtMs: receivedAt, records: records, contentType: "application/json")
        // The sending device travels with the batch (docs/FLEET.md, "Ingest stream").
        if let d = principal.deviceId { headers.append(("Pylon-Device", d)) }
        // The event index rows (`Store+Events.swift`), written once JetStream acknowledged.
        let index = EventIndex.Published(records: Store.indexed(batch, keepData: true), installId: principal.installId)
        let device = principal.deviceId
        let admission = js.publish(subject: subject, msgID: key, headers: headers, body: body) { [weak self] outcome in
            guard let self else { return }
            // The ledger and index writes wait in the lane like the batch did, and are committed
            // with the other batches of its slice (`IngestLane`).
            let record = { [unowned self] () -> IngestLane.Writes? in
                self.streamOutcome(
                    outcome, answer, key: key, stream: stream, receivedAt: receivedAt, records: records, index: index, device: device)
            }
            if let lane = self.lane {
                lane.enqueue(record)
            } else if let w = record() {
                self.commit([w])
            }
        }
        switch admission {
        case .published:
            return .later(answer)
        case .unavailable(let why):
            throw APIError(status: 503, code: .streamUnavailable, message: "ingest stream unavailable: \(why); retry", retryAfter: 1)
        case .tooLarge(let why):
            throw .tooLarge("\(why); split the batch")
        case .busy:
            throw APIError(
                status: 503, code: .serverBusy,
                message: "\(js.settings.maxPending) batches are waiting for JetStream's acknowledgement; retry", retryAfter: 1)
        }
    }

    /// JetStream's answer for a batch: an acknowledged one leaves its ledger and index writes to
    /// the caller's commit (the device is answered after it); the others answer at once.
    private func streamOutcome(
        _ outcome: JetStreamPublisher.Outcome, _ answer: DeferredAnswer, key: String, stream: String, receivedAt: Int64, records: Int,
        index: EventIndex.Published, device: String?
    ) -> IngestLane.Writes? {
        switch outcome {
        case .acked(let seq, let duplicate, let late):
            var fresh = !duplicate
            return IngestLane.Writes(
                write: { [unowned self] () throws(StoreError) in
                    fresh =
                        try store.ledgerRecord(
                            key: key, stream: stream, receivedAt: receivedAt, records: records, duplicate: duplicate, deviceId: device)
                        && !duplicate
                    if fresh {
                        try store.indexEvents(
                            index.records, stream: stream, receivedAt: receivedAt, installId: index.installId, jsSeq: seq)
                    }
                },
                done: { [unowned self] error in
                    if let error {
                        // The batch is in the stream: the device is told so. Its key is not in
                        // the ledger, so a re-send after the duplicate window would be published again.
                        log.error("ingest ledger failed", ["stream": stream, "key": key, "error": error.description])
                        fresh = !duplicate
                    }
                    log.debug("batch acknowledged", ["stream": stream, "key": key, "seq": seq, "duplicate": !fresh, "late": late])
                    answer.answer(
                        Backend.ingestAnswer(
                            accepted: fresh ? records : 0, duplicates: fresh ? 0 : records, duplicateBatch: !fresh, seq: seq))
                })
        case .failed(let why):
            log.warn("batch not stored", ["stream": stream, "key": key, "reason": why])
            answer.answer(
                HTTPResponse(APIError(status: 503, code: .streamUnavailable, message: "\(why); retry", retryAfter: 1)))
            return nil
        case .tooLarge(let why):
            log.warn("batch not stored", ["stream": stream, "key": key, "reason": why])
            answer.answer(HTTPResponse(APIError.tooLarge("\(why); split the batch")))
            return nil
        case .timedOut:
            log.warn("batch not acknowledged in time", ["stream": stream, "key": key])
            let ms = jetstream?.settings.ackTimeoutMs ?? 0
            answer.answer(
                HTTPResponse(
                    APIError(
                        status: 503, code: .streamUnavailable,
                        message: "JetStream did not acknowledge the batch within \(ms) ms or before the connection was lost; retry",
                        retryAfter: 1)))
            return nil
        }
    }

    /// The ingest response body (both modes); `streamSeq` only in NATS mode.
    static func ingestAnswer(accepted: Int, duplicates: Int, duplicateBatch: Bool, seq: Int64?) -> HTTPResponse {
        var o: JSONObject = [
            "accepted": .int(Int64(accepted)), "duplicates": .int(Int64(duplicates)), "duplicateBatch": .bool(duplicateBatch),
        ]
        if let seq { o["streamSeq"] = .int(seq) }
        return HTTPResponse(.object(o))
    }

    /// The `Idempotency-Key` header, validated (400 when absent or unusable).
    func idempotencyKey(_ request: HTTPRequest) throws(APIError) -> String {
        guard let key = request.header("idempotency-key") else {
            throw .badRequest(.missingIdempotencyKey, "the Idempotency-Key header is required")
        }
        if let why = Router.invalidName(key, what: "Idempotency-Key") { throw .badRequest(.invalidRequest, why) }
        return key
    }

    /// `nats` in `/v1/inspect/stats` (NATS mode only).
    var natsStatsJSON: JSON? {
        guard let js = jetstream else { return nil }
        let c = js.counters
        return [
            "ready": .bool(js.isReady), "stream": .string(js.settings.stream.name), "inFlight": .int(Int64(js.inFlight)),
            "published": .int(Int64(c.published)), "acked": .int(Int64(c.acked)), "duplicates": .int(Int64(c.duplicates)),
            "failed": .int(Int64(c.failed)), "timedOut": .int(Int64(c.timedOut)), "lateAcks": .int(Int64(c.lateAcks)),
            "unavailable": .int(Int64(c.unavailable)), "busy": .int(Int64(c.busy)), "connects": .int(Int64(c.reconnects)),
        ]
    }
}
