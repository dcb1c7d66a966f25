import PylonCore

/// A validated ingest batch, ready to store: its records' ids and data as byte ranges of one
/// buffer, so storing a record binds bytes and builds no Swift value.
///
/// Read by one reader, `read(raw:)`, from the body's bytes in one walk, without building a tree
/// (json-c's tokener and the allocations of its tree were a third of the backend's CPU per
/// ingested record): the body validated strictly (RFC 8259), keys and strings decoded, the last
/// of a repeated key winning, each record's `data` stored in Pylon's canonical form
/// (docs/PROTOCOL.md "Canonical form").
struct Batch {
    struct Record {
        /// The id's bytes (UTF-8, decoded) in `text`.
        var id: Range<Int>
        var ts: Int64
        /// The record's `data` in canonical form, in `text`; nil when absent or `null` (stored as
        /// `null`).
        var data: Range<Int>?
    }

    var key: String
    var stream: String
    /// The bytes the records' ranges point into: the body itself, with decoded ids and
    /// compacted data appended when there are any.
    var text: [UInt8]
    var records: [Record]

    /// Parses and validates a batch body:
    /// `{"batch": key?, "stream": stream?, "records": [{"id": String, "ts": Int, "data": Any?}]}`.
    /// `batch` and `stream`, when present, must equal the `Idempotency-Key` header and the
    /// stream in the path. Throws 400 `invalid_json` or `invalid_batch`.
    static func parse(_ body: [UInt8], key: String, stream: String) throws(APIError) -> Batch {
        try read(raw: body, key: key, stream: stream).get()
    }

    /// Reads a body from its bytes: the batch, or the first error — `invalid_json` when it is not
    /// strictly valid JSON nested at most `Limits.maxJSONDepth` levels, else the batch checks in
    /// order (the body an object; `batch`, `stream`; then each record in turn).
    static func read(raw body: [UInt8], key: String, stream: String) -> Result<Batch, APIError> {
        var extra: [UInt8] = []
        let walked: Result<[Record], APIError> = body.withUnsafeBytes { t in
            switch RawJSON.validate(t, maxDepth: Int(Limits.maxJSONDepth)) {
            case .valid: break
            case .invalid(let at): return .failure(.badRequest(.invalidJSON, "body is not valid JSON: invalid JSON text at byte \(at)"))
            case .tooDeep:
                return .failure(.badRequest(.invalidJSON, "body is not valid JSON: nested deeper than \(Limits.maxJSONDepth) levels"))
            }
            let first = RawJSON.skipSpace(t, 0)
            guard t[first] == UInt8(ascii: "{") else { return .failure(invalid("body must be a JSON object")) }
            var batchSpan: Range<Int>?
            var streamSpan: Range<Int>?
            /// The records as walked, the last `records` member winning (nil: never seen).
            var records: Result<[Record], APIError>?
            var members = RawJSON.MemberCursor(t, first..<t.count)
            while let m = members.nextKey() {
                if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "batch") {
                    batchSpan = members.skipValue()
                } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "stream") {
                    streamSpan = members.skipValue()
                } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "records") {
                    guard t[m.valueStart] == UInt8(ascii: "[") else {
                        records = .failure(recordsNotArray)
                        continue
                    }
                    extra.removeAll(keepingCapacity: true)
                    let (list, end) = walkRecords(t, at: m.valueStart, extraBase: body.count, extra: &extra)
                    records = list
                    if let end { members.resume(at: end) }  // else stopped at an error: the cursor skips the rest
                }
            }
            // The top-level checks first (names compared as Swift strings).
            if let s = batchSpan, RawJSON.stringValue(t, s) != key { return .failure(batchMismatch) }
            if let s = streamSpan, RawJSON.stringValue(t, s) != stream { return .failure(streamMismatch) }
            return records ?? .failure(recordsNotArray)
        }
        switch walked {
        case .failure(let e): return .failure(e)
        case .success(let records):
            var text = body
            if !extra.isEmpty { text.append(contentsOf: extra) }
            return .success(Batch(key: key, stream: stream, text: text, records: records))
        }
    }

    /// Walks the records array at `start` once, checking each record: the records (ids and data
    /// written as stored already point into `t`; others are decoded or compacted into `extra`,
    /// whose bytes will follow `t`'s, at `extraBase`) and the index past the array, or the first
    /// record's error (and no index).
    private static func walkRecords(
        _ t: UnsafeRawBufferPointer, at start: Int, extraBase: Int, extra: inout [UInt8]
    ) -> (Result<[Record], APIError>, end: Int?) {
        var list: [Record] = []
        var scratch = RawJSON.CanonicalScratch()  // reused by every record
        var elements = RawJSON.ElementCursor(t, start..<t.count)
        while let e = elements.nextElement() {
            let i = list.count
            guard t[e] == UInt8(ascii: "{") else { return (.failure(notObject(i)), nil) }
            var id: Range<Int>?
            var ts: Range<Int>?
            /// The last `data`: its span and canonical length.
            var data: (span: Range<Int>, length: Int)?
            var members = RawJSON.MemberCursor(t, e..<t.count)
            while let m = members.nextKey() {
                if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "id") {
                    id = members.skipValue()
                } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "ts") {
                    ts = members.skipValue()
                } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "data") {
                    // canonical both measures the value and finds its end.
                    let (length, end) = RawJSON.canonical(t, at: m.valueStart, scratch: &scratch)
                    data = (m.valueStart..<end, length)
                    members.resume(at: end)
                }
            }
            elements.resume(at: members.position)

            guard let id, t[id.lowerBound] == UInt8(ascii: "\"") else { return (.failure(idNotString(i)), nil) }
            var idRange = (id.lowerBound + 1)..<(id.upperBound - 1)
            if RawJSON.contains(t, idRange, UInt8(ascii: "\\")) {
                let decoded = RawJSON.decode(t, idRange)
                if let why = decoded.withUnsafeBytes({ Router.invalidName($0, what: recordID(i)) }) { return (.failure(invalid(why)), nil) }
                idRange = (extraBase + extra.count)..<(extraBase + extra.count + decoded.count)
                extra.append(contentsOf: decoded)
            } else if let why = Router.invalidName(UnsafeRawBufferPointer(rebasing: t[idRange]), what: recordID(i)) {
                return (.failure(invalid(why)), nil)
            }
            // An integer beyond Int64 reads as the nearest one (as json-c reads it).
            guard let ts, let v = RawJSON.integer(t, ts), v >= 0 else { return (.failure(badTS(i)), nil) }

            var dataRange: Range<Int>?
            if let data, !RawJSON.equals(t, data.span.lowerBound, data.span.upperBound, "null") {
                if data.length == data.span.count {
                    dataRange = data.span  // already canonical: the bytes as written
                } else {
                    let at = extra.count
                    extra.append(contentsOf: repeatElement(0, count: data.span.count))  // the walk's room
                    extra.withUnsafeMutableBytes { out in
                        _ = RawJSON.canonical(t, at: data.span.lowerBound, into: out.baseAddress! + at, scratch: &scratch)
                    }
                    extra.removeLast(data.span.count - data.length)
                    dataRange = (extraBase + at)..<(extraBase + at + data.length)
                }
            }
            list.append(Record(id: idRange, ts: v, data: dataRange))
        }
        return (.success(list), elements.position)
    }

    // MARK: Errors

    static func invalid(_ message: String) -> APIError { .badRequest(.invalidBatch, message) }
    static let batchMismatch = invalid("\"batch\" must be a string equal to the Idempotency-Key header")
    static let streamMismatch = invalid("\"stream\" must be a string equal to the stream in the path")
    static let recordsNotArray = invalid("\"records\" must be an array")
    static func notObject(_ i: Int) -> APIError { invalid("records[\(i)] must be an object") }
    static func idNotString(_ i: Int) -> APIError { invalid("records[\(i)].id must be a string") }
    static func recordID(_ i: Int) -> String { "records[\(i)].id" }
    static func badTS(_ i: Int) -> APIError { invalid("records[\(i)].ts must be a non-negative integer (milliseconds)") }
}

/// Parses a request body as one JSON text with json-c (depth `Limits.maxJSONDepth`, UTF-8
/// validated), keeping json-c's tree. Throws 400 `invalid_json`.
func parseJSONBodyRef(_ body: [UInt8]) throws(APIError) -> JSONRef {
    let r: Result<JSONRef, JSONParseError> = body.withUnsafeBytes { b in
        do throws(JSONParseError) {
            return .success(try JSONRef.parse(b, maxDepth: Limits.maxJSONDepth))
        } catch {
            return .failure(error)
        }
    }
    switch r {
    case .success(let ref): return ref
    case .failure(let e): throw .badRequest(.invalidJSON, "body is not valid JSON: \(e.detail)")
    }
}

/// `parseJSONBodyRef` converted to a Swift value.
func parseJSONBody(_ body: [UInt8]) throws(APIError) -> JSON { try parseJSONBodyRef(body).json }
