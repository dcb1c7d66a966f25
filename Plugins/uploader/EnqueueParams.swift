import CJSONC
import PylonPluginKit

#if canImport(Glibc)
import Glibc
#endif

/// What the params of an `uploader.enqueue` say: `{stream, consent?, records: [{id, ts?, data}]}`.
/// Read by one of two readers that agree on every input: `init(ref:)` from a json-c tree, and
/// `read(raw:)` from the params' JSON text without building objects (nil when it is not sure,
/// and the caller then parses the text and uses the first). Checks that need the uploader's state
/// (stream access, consent) are the uploader's; the records' errors are kept here and reported
/// after those, as the method's documented order says.
struct EnqueueParams {
    enum Consent: Equatable {
        case absent
        case named(String)
        /// Present but not a string.
        case invalid
    }
    /// The stream, when it is a string and a valid stream name (`Uploader.validStream`).
    var stream: String?
    var consent: Consent
    /// The records (pointing into the parsed tree, the params text or `storage`) and what they
    /// are estimated to count in the disk cap (`Chunk.estimatedCharge`), or the first error found
    /// in them.
    var records: Result<(list: [PendingRecord], bytes: Int), RPCError>
    /// Bodies the raw reader rewrote (compacted), kept alive with the records that point in.
    var storage: ByteBox?

    init(stream: String?, consent: Consent, records: Result<(list: [PendingRecord], bytes: Int), RPCError>, storage: ByteBox? = nil) {
        self.stream = stream
        self.consent = consent
        self.records = records
        self.storage = storage
    }

    // MARK: Errors, worded once for both readers

    static let streamError = RPCError(.invalidParams, "params.stream is required: 1-128 of [A-Za-z0-9._:-]")
    static let recordsError = RPCError(.invalidParams, "params.records must be a non-empty array")
    static func tooMany(_ limits: UploaderLimits) -> RPCError {
        RPCError(.invalidParams, "at most \(limits.maxRecordsPerCall) records per call")
    }
    static func idError(_ i: Int) -> RPCError {
        RPCError(
            .invalidParams,
            "records[\(i)].id must be a string of 1-\(maxIdBytes) bytes without control characters (U+0000-U+001F, U+007F)")
    }
    static func tsError(_ i: Int) -> RPCError {
        RPCError(.invalidParams, "records[\(i)].ts must be a non-negative integer (milliseconds since the epoch)")
    }
    static func sizeError(_ i: Int, _ limits: UploaderLimits) -> RPCError {
        RPCError(.invalidParams, "records[\(i)] is larger than \(limits.maxRecordBytes) bytes")
    }
    /// The longest record id, in bytes.
    static let maxIdBytes = 128

    /// Whether `id` (its UTF-8 bytes, unescaped) is an id the uploader stores: 1-128 bytes and no
    /// control character (U+0000-U+001F, U+007F). The backend refuses a batch holding any other
    /// (`Router.invalidName` in Sources/PylonBackend: at most 256 bytes, no byte below 0x20 or
    /// 0x7F) with a 400, which set the whole batch aside: ids it would refuse are refused here,
    /// at the enqueue, instead.
    static func isValidID(_ id: UnsafeRawBufferPointer) -> Bool {
        guard !id.isEmpty, id.count <= maxIdBytes else { return false }
        return !id.contains { $0 < 0x20 || $0 == 0x7F }
    }

    // MARK: From a json-c tree

    /// Reads params from their json-c object (borrowed; the records point into it, so it must
    /// outlive them). `wall` is the time of records without an integer `ts`.
    init(ref params: OpaquePointer?, limits: UploaderLimits, wall: Int64) {
        func member(_ key: String) -> OpaquePointer?? {
            var v: OpaquePointer?
            guard json_object_object_get_ex(params, key, &v) != 0 else { return nil }
            return .some(v)
        }
        func string(_ v: OpaquePointer?) -> String? {
            guard json_object_get_type(v) == json_type_string else { return nil }
            return String(cString: json_object_get_string(v))
        }
        stream = member("stream").flatMap { string($0) }.flatMap { Uploader.validStream($0) ? $0 : nil }
        switch member("consent") {
        case nil: consent = .absent
        case .some(let v): consent = string(v).map { .named($0) } ?? .invalid
        }
        records = EnqueueParams.records(member("records") ?? nil, limits: limits, wall: wall)
    }

    /// Records are read straight from the parsed json-c tree: no conversion to Swift values.
    private static func records(_ list: OpaquePointer?, limits: UploaderLimits, wall: Int64) -> Result<
        (list: [PendingRecord], bytes: Int), RPCError
    > {
        guard json_object_get_type(list) == json_type_array, json_object_array_length(list) > 0 else { return .failure(recordsError) }
        let count = json_object_array_length(list)
        guard count <= limits.maxRecordsPerCall else { return .failure(tooMany(limits)) }
        var records: [PendingRecord] = []
        records.reserveCapacity(count)
        var bytes = 0
        for i in 0..<count {
            let r = json_object_array_get_idx(list, i)
            var idObj: OpaquePointer?
            var dataObj: OpaquePointer?
            var tsObj: OpaquePointer?
            guard json_object_object_get_ex(r, "id", &idObj) != 0, json_object_get_type(idObj) == json_type_string,
                case let n = json_object_get_string_len(idObj), let id = json_object_get_string(idObj),
                isValidID(UnsafeRawBufferPointer(start: id, count: Int(n)))
            else { return .failure(idError(i)) }
            // A record is an object `{id, ts?, data}` (the id lookup above fails for anything
            // else); a record without `data` is stored whole.
            if json_object_object_get_ex(r, "data", &dataObj) == 0 { dataObj = r }
            var bodyLen = 0
            guard let body = json_object_to_json_string_length(dataObj, flagsPlain, &bodyLen), bodyLen <= limits.maxRecordBytes else {
                return .failure(sizeError(i, limits))
            }
            var ts = wall
            if json_object_object_get_ex(r, "ts", &tsObj) != 0, json_object_get_type(tsObj) == json_type_int {
                ts = json_object_get_int64(tsObj)
                // The backend refuses a negative ts (400), as it does a bad id.
                guard ts >= 0 else { return .failure(tsError(i)) }
            }
            bytes += Chunk.estimatedCharge(idBytes: Int(n), dataBytes: bodyLen)
            records.append(PendingRecord(id: id, idLength: n, ts: ts, body: body, bodyLength: Int32(bodyLen)))
        }
        return .success((records, bytes))
    }

    // MARK: From the params' text

    /// Reads params from their JSON text (valid JSON; the records point into it, so it must
    /// outlive them), or nil when the bytes alone cannot say what json-c would read: a key written
    /// with escapes, a stream, consent or record id with escapes, an integer `ts` beyond Int64, or
    /// a body json-c would print differently (see `RawJSON.jsonCText`).
    static func read(raw t: UnsafeRawBufferPointer, limits: UploaderLimits, wall: Int64) -> EnqueueParams? {
        var scratch = Scratch()
        return read(raw: t, limits: limits, wall: wall, scratch: &scratch)
    }

    /// What the raw reader walks into, kept by a caller that reads many requests so its storage
    /// is allocated once, not per request.
    struct Scratch {
        var records: [RawRecord] = []
        /// `RawJSON.jsonCText`'s key list.
        var keys: [Range<Int>] = []
    }

    /// `read(raw:limits:wall:)` walking into `scratch`.
    static func read(raw t: UnsafeRawBufferPointer, limits: UploaderLimits, wall: Int64, scratch: inout Scratch) -> EnqueueParams? {
        let first = RawJSON.skipSpace(t, 0)
        guard first < t.count, t[first] == UInt8(ascii: "{") else { return nil }
        var streamSpan: Range<Int>?
        var consentSpan: Range<Int>?
        /// Whether `records` is an array (walked into `scratch.records`), the last `records`
        /// member winning; nil when there is none.
        var walked: Bool?
        var members = RawJSON.MemberCursor(t, first..<t.count)
        while let m = members.nextKey() {
            if m.keyEscaped { return nil }
            if RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "stream") {
                streamSpan = members.skipValue()
            } else if RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "consent") {
                consentSpan = members.skipValue()
            } else if RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "records") {
                guard t[m.valueStart] == UInt8(ascii: "[") else { walked = false; continue }
                guard let end = walkRecords(t, at: m.valueStart, keep: limits.maxRecordsPerCall + 1, into: &scratch) else { return nil }
                walked = true
                members.resume(at: end)
            }
        }
        var p = EnqueueParams(stream: nil, consent: .absent, records: .failure(recordsError), storage: nil)
        if let s = streamSpan, t[s.lowerBound] == UInt8(ascii: "\"") {
            guard let name = RawJSON.plainString(t, s) else { return nil }
            p.stream = Uploader.validStream(name) ? name : nil
        }
        if let s = consentSpan {
            if t[s.lowerBound] == UInt8(ascii: "\"") {
                guard let name = RawJSON.plainString(t, s) else { return nil }
                p.consent = .named(name)
            } else {
                p.consent = .invalid
            }
        }
        guard walked == true, !scratch.records.isEmpty else { return p }
        let elements = scratch.records
        guard elements.count <= limits.maxRecordsPerCall else {
            p.records = .failure(tooMany(limits))
            return p
        }
        var records: [PendingRecord] = []
        records.reserveCapacity(elements.count)
        var bytes = 0
        let base = t.baseAddress!
        for (i, r) in elements.enumerated() {
            // The id: a string of 1-128 bytes; one with escapes is json-c's to decode.
            guard let id = r.id, t[id.lowerBound] == UInt8(ascii: "\"") else {
                p.records = .failure(idError(i))
                return p
            }
            let idBytes = (id.lowerBound + 1)..<(id.upperBound - 1)
            guard !RawJSON.contains(t, idBytes, UInt8(ascii: "\\")) else { return nil }
            guard isValidID(UnsafeRawBufferPointer(rebasing: t[idBytes])) else {
                p.records = .failure(idError(i))
                return p
            }
            // The body: what json-c would print for `data` (or the whole record).
            let data = r.data ?? r.span
            guard let bodyLen = r.data != nil ? r.dataLength : RawJSON.jsonCText(t, r.span) else { return nil }
            guard bodyLen <= limits.maxRecordBytes else {
                p.records = .failure(sizeError(i, limits))
                return p
            }
            let body: UnsafeRawPointer
            if bodyLen == data.count {
                body = base + data.lowerBound  // already compact: the bytes json-c would print
            } else {
                if p.storage == nil { p.storage = ByteBox(capacity: t.count) }
                let out = p.storage!.reserve(bodyLen)
                _ = RawJSON.jsonCText(t, data, into: out)
                body = UnsafeRawPointer(out)
            }
            var ts = wall
            if let s = r.ts, RawJSON.isNumber(t[s.lowerBound]) {
                if let v = RawJSON.plainInt(t, s) {
                    guard v >= 0 else {
                        p.records = .failure(tsError(i))
                        return p
                    }
                    ts = v
                } else if !RawJSON.isFraction(t, s) {
                    return nil  // an integer beyond Int64: json-c clamps it
                }
            }
            bytes += Chunk.estimatedCharge(idBytes: idBytes.count, dataBytes: bodyLen)
            records.append(
                PendingRecord(
                    id: (base + idBytes.lowerBound).assumingMemoryBound(to: CChar.self), idLength: Int32(idBytes.count),
                    ts: ts, body: body.assumingMemoryBound(to: CChar.self), bodyLength: Int32(bodyLen)))
        }
        p.records = .success((records, bytes))
        return p
    }

    /// One element of `records` as the raw walk saw it: its span, and the spans of its `id`,
    /// `ts` and `data` members (the last of each), with the length json-c would print `data` in
    /// (nil when that is not certain).
    struct RawRecord {
        var span: Range<Int>
        var id: Range<Int>?
        var ts: Range<Int>?
        var data: Range<Int>?
        var dataLength: Int?
    }

    /// Walks the records array at `start` once into `scratch.records`: each record's members,
    /// and `data` through `RawJSON.jsonCText` (which both measures and skips it). Keeps the first
    /// `keep` records (the rest are only skipped, to find the end). Returns the index past the
    /// array; nil when a key is written with escapes.
    private static func walkRecords(_ t: UnsafeRawBufferPointer, at start: Int, keep: Int, into scratch: inout Scratch) -> Int? {
        scratch.records.removeAll(keepingCapacity: true)
        var elements = RawJSON.ElementCursor(t, start..<t.count)
        while let e = elements.nextElement() {
            guard scratch.records.count < keep, t[e] == UInt8(ascii: "{") else {
                let span = elements.skipValue()
                if scratch.records.count < keep { scratch.records.append(RawRecord(span: span)) }
                continue
            }
            var r = RawRecord(span: e..<e)
            var members = RawJSON.MemberCursor(t, e..<t.count)
            while let m = members.nextKey() {
                if m.keyEscaped { return nil }
                switch m.key.count {
                case 2 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "id"): r.id = members.skipValue()
                case 2 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "ts"): r.ts = members.skipValue()
                case 4 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "data"):
                    if let (length, end) = RawJSON.jsonCText(t, at: m.valueStart, scratch: &scratch.keys) {
                        r.data = m.valueStart..<end
                        r.dataLength = length
                        members.resume(at: end)
                    } else {
                        r.data = members.skipValue()
                        r.dataLength = nil
                    }
                default: break
                }
            }
            r.span = e..<members.position
            elements.resume(at: members.position)
            scratch.records.append(r)
        }
        return elements.position
    }
}

/// Bytes that stay where they are until the box is released: the compacted record bodies of one
/// raw enqueue, which its pending records point into until the group commit.
final class ByteBox {
    private let base: UnsafeMutableRawPointer
    private let capacity: Int
    private var used = 0

    init(capacity: Int) {
        self.capacity = max(1, capacity)
        base = .allocate(byteCount: self.capacity, alignment: 8)
    }

    deinit { base.deallocate() }

    /// `n` more bytes of room (the caller writes them); never more than the capacity in all.
    func reserve(_ n: Int) -> UnsafeMutableRawPointer {
        precondition(used + n <= capacity, "ByteBox overflow")
        defer { used += n }
        return base + used
    }
}
