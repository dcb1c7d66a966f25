import PylonCore

/// The raw reader: a batch body read from its bytes in one walk, without building json-c's tree
/// (json-c's tokener and the allocations of its tree were a third of the backend's CPU per
/// ingested record).
extension Batch {
    /// Reads a body from its bytes: the batch, the error json-c's reader would throw, or nil when
    /// the bytes alone cannot say what that reader would decide — the body is not strictly valid
    /// JSON (json-c words the error), a key, id, `batch` or `stream` is written with escapes, a
    /// `ts` is an integer beyond Int64 (json-c clamps it), or a record's `data` is text json-c
    /// prints differently in more than whitespace (see `RawJSON.jsonCText`).
    static func read(raw body: [UInt8], key: String, stream: String) -> Result<Batch, APIError>? {
        var extra: [UInt8] = []
        let walked: Result<[Record], APIError>?? = body.withUnsafeBytes { t in
            // classifyMessage's depth counts levels below the top one; json-c's counts them all.
            guard case .message = RawJSON.classifyMessage(t, maxDepth: Int(Limits.maxJSONDepth) - 1) else { return nil }
            var batchSpan: Range<Int>?
            var streamSpan: Range<Int>?
            /// The records as walked, the last `records` member winning (nil: never seen).
            var records: Result<[Record], APIError>?
            let first = RawJSON.skipSpace(t, 0)
            var members = RawJSON.MemberCursor(t, first..<t.count)
            while let m = members.nextKey() {
                if m.keyEscaped { return nil }
                switch m.key.count {
                case 5 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "batch"): batchSpan = members.skipValue()
                case 6 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "stream"): streamSpan = members.skipValue()
                case 7 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "records"):
                    guard t[m.valueStart] == UInt8(ascii: "[") else {
                        records = .failure(recordsNotArray)
                        continue
                    }
                    extra.removeAll(keepingCapacity: true)
                    guard let (list, end) = walkRecords(t, at: m.valueStart, extraBase: body.count, extra: &extra) else { return nil }
                    records = list
                    if let end { members.resume(at: end) }  // else stopped at an error: the cursor skips the rest
                default: break
                }
            }
            // The checks in json-c's reader's order (names compared as Swift strings, as there).
            if let s = batchSpan {
                guard t[s.lowerBound] == UInt8(ascii: "\"") else { return .some(.failure(batchMismatch)) }
                guard let v = RawJSON.plainString(t, s) else { return nil }
                if v != key { return .some(.failure(batchMismatch)) }
            }
            if let s = streamSpan {
                guard t[s.lowerBound] == UInt8(ascii: "\"") else { return .some(.failure(streamMismatch)) }
                guard let v = RawJSON.plainString(t, s) else { return nil }
                if v != stream { return .some(.failure(streamMismatch)) }
            }
            return .some(records ?? .failure(recordsNotArray))
        }
        guard case let result?? = walked else { return nil }
        switch result {
        case .failure(let e): return .failure(e)
        case .success(let records):
            var text = body
            if !extra.isEmpty { text.append(contentsOf: extra) }
            return .success(Batch(key: key, stream: stream, text: text, records: records))
        }
    }

    /// Walks the records array at `start` once, checking each record as `read(tree:)` does:
    /// the records (data written compact already point into `t`; others are compacted into
    /// `extra`, whose bytes will follow `t`'s, at `extraBase`) and the index past the array, or
    /// the first record's error (and no index). nil when json-c must decide.
    private static func walkRecords(
        _ t: UnsafeRawBufferPointer, at start: Int, extraBase: Int, extra: inout [UInt8]
    ) -> (Result<[Record], APIError>, end: Int?)? {
        var list: [Record] = []
        var keys: [Range<Int>] = []  // jsonCText's duplicate-key scratch, reused by every record
        var elements = RawJSON.ElementCursor(t, start..<t.count)
        while let e = elements.nextElement() {
            let i = list.count
            guard t[e] == UInt8(ascii: "{") else { return (.failure(notObject(i)), nil) }
            var id: Range<Int>?
            var ts: Range<Int>?
            /// The last `data`: its span and the length json-c prints it in (nil: not certain).
            var data: (span: Range<Int>, length: Int?)?
            var members = RawJSON.MemberCursor(t, e..<t.count)
            while let m = members.nextKey() {
                if m.keyEscaped { return nil }
                switch m.key.count {
                case 2 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "id"): id = members.skipValue()
                case 2 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "ts"): ts = members.skipValue()
                case 4 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "data"):
                    // jsonCText both measures the value and finds its end.
                    if let (length, end) = RawJSON.jsonCText(t, at: m.valueStart, scratch: &keys) {
                        data = (m.valueStart..<end, length)
                        members.resume(at: end)
                    } else {
                        data = (members.skipValue(), nil)
                    }
                default: break
                }
            }
            elements.resume(at: members.position)

            guard let id, t[id.lowerBound] == UInt8(ascii: "\"") else { return (.failure(idNotString(i)), nil) }
            let idBytes = (id.lowerBound + 1)..<(id.upperBound - 1)
            guard !RawJSON.contains(t, idBytes, UInt8(ascii: "\\")) else { return nil }
            if let why = Router.invalidName(UnsafeRawBufferPointer(rebasing: t[idBytes]), what: recordID(i)) {
                return (.failure(invalid(why)), nil)
            }
            guard let ts, RawJSON.isNumber(t[ts.lowerBound]) else { return (.failure(badTS(i)), nil) }
            guard let v = RawJSON.plainInt(t, ts) else {
                // A fraction or exponent is a double to json-c; anything else here is an integer
                // beyond Int64, which json-c clamps.
                return RawJSON.isFraction(t, ts) ? (.failure(badTS(i)), nil) : nil
            }
            guard v >= 0 else { return (.failure(badTS(i)), nil) }

            var dataRange: Range<Int>?
            if let data {
                guard let length = data.length else { return nil }
                if RawJSON.equals(t, data.span.lowerBound, data.span.upperBound, "null") {
                    dataRange = nil
                } else if length == data.span.count {
                    dataRange = data.span  // already compact: the bytes json-c would print
                } else {
                    let at = extra.count
                    extra.append(contentsOf: repeatElement(0, count: length))
                    extra.withUnsafeMutableBytes { out in
                        _ = RawJSON.jsonCText(t, at: data.span.lowerBound, into: out.baseAddress! + at, scratch: &keys)
                    }
                    dataRange = (extraBase + at)..<(extraBase + at + length)
                }
            }
            list.append(Record(id: idBytes, ts: v, data: dataRange))
        }
        return (.success(list), elements.position)
    }
}
