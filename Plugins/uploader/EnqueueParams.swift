import PylonPluginKit

#if canImport(Glibc)
import Glibc
#endif

/// What the params of an `uploader.enqueue` say: `{stream, consent?, records: [{id, ts?, data}]}`.
/// Read by one reader, `read(raw:)`, from the params' JSON text without building objects. Checks
/// that need the uploader's state
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
    /// The records (pointing into the params text or `storage`) and what they
    /// are estimated to count in the disk cap (`Chunk.estimatedCharge`), or the first error found
    /// in them.
    var records: Result<(list: [PendingRecord], bytes: Int), RPCError>
    /// Ids and bodies the reader rewrote (decoded, canonical), kept alive with the records that point in.
    var storage: ByteBox?

    init(stream: String?, consent: Consent, records: Result<(list: [PendingRecord], bytes: Int), RPCError>, storage: ByteBox? = nil) {
        self.stream = stream
        self.consent = consent
        self.records = records
        self.storage = storage
    }

    // MARK: Errors

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

    // MARK: From the params' text

    /// Reads params from their JSON text (valid JSON, as the host checked it; the records point
    /// into it or into `storage`, so it must outlive them) — the one reader of these params
    /// (docs/PROTOCOL.md "Canonical form"): keys and strings decoded, the last of a repeated key
    /// winning, each record's body stored in Pylon's canonical form. `wall` is the time of
    /// records without an integer `ts`.
    static func read(raw t: UnsafeRawBufferPointer, limits: UploaderLimits, wall: Int64) -> EnqueueParams {
        var scratch = Scratch()
        return read(raw: t, limits: limits, wall: wall, scratch: &scratch)
    }

    /// What the reader walks into, kept by a caller that reads many requests so its storage is
    /// allocated once, not per request.
    struct Scratch {
        var records: [RawRecord] = []
        /// `RawJSON.canonical`'s walk.
        var canonical = RawJSON.CanonicalScratch()
        /// A decoded id.
        var id: [UInt8] = []
    }

    /// `read(raw:limits:wall:)` walking into `scratch`.
    static func read(raw t: UnsafeRawBufferPointer, limits: UploaderLimits, wall: Int64, scratch: inout Scratch) -> EnqueueParams {
        var p = EnqueueParams(stream: nil, consent: .absent, records: .failure(recordsError), storage: nil)
        let first = RawJSON.skipSpace(t, 0)
        guard first < t.count, t[first] == UInt8(ascii: "{") else { return p }
        var streamSpan: Range<Int>?
        var consentSpan: Range<Int>?
        /// Whether `records` is an array (walked into `scratch.records`), the last `records`
        /// member winning; nil when there is none.
        var walked: Bool?
        var members = RawJSON.MemberCursor(t, first..<t.count)
        while let m = members.nextKey() {
            if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "stream") {
                streamSpan = members.skipValue()
            } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "consent") {
                consentSpan = members.skipValue()
            } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "records") {
                guard t[m.valueStart] == UInt8(ascii: "[") else { walked = false; continue }
                members.resume(at: walkRecords(t, at: m.valueStart, keep: limits.maxRecordsPerCall + 1, into: &scratch))
                walked = true
            }
        }
        if let s = streamSpan, let name = RawJSON.stringValue(t, s) {
            p.stream = Uploader.validStream(name) ? name : nil
        }
        if let s = consentSpan {
            p.consent = RawJSON.stringValue(t, s).map { .named($0) } ?? .invalid
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
        /// Room for what is rewritten: a decoded id lies inside its record's text, a body is at
        /// most its text, and records do not overlap, so twice the text is enough.
        func box() -> ByteBox {
            if p.storage == nil { p.storage = ByteBox(capacity: 2 * t.count) }
            return p.storage!
        }
        for (i, r) in elements.enumerated() {
            // The id: a string of 1-128 bytes once decoded.
            guard let id = r.id, t[id.lowerBound] == UInt8(ascii: "\"") else {
                p.records = .failure(idError(i))
                return p
            }
            let idText = (id.lowerBound + 1)..<(id.upperBound - 1)
            var idStart = UnsafeRawPointer(base + idText.lowerBound)
            var idCount = idText.count
            if RawJSON.contains(t, idText, UInt8(ascii: "\\")) {
                scratch.id.removeAll(keepingCapacity: true)
                RawJSON.decode(t, idText, into: &scratch.id)
                guard scratch.id.withUnsafeBytes({ isValidID($0) }) else {
                    p.records = .failure(idError(i))
                    return p
                }
                let out = box().reserve(scratch.id.count)
                scratch.id.withUnsafeBytes { out.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                idStart = UnsafeRawPointer(out)
                idCount = scratch.id.count
            } else {
                guard isValidID(UnsafeRawBufferPointer(rebasing: t[idText])) else {
                    p.records = .failure(idError(i))
                    return p
                }
            }
            // The body: `data` (or the whole record) in canonical form.
            let data = r.data ?? r.span
            let bodyLen = r.data != nil ? r.dataLength : RawJSON.canonical(t, at: r.span.lowerBound, scratch: &scratch.canonical).length
            guard bodyLen <= limits.maxRecordBytes else {
                p.records = .failure(sizeError(i, limits))
                return p
            }
            let body: UnsafeRawPointer
            if bodyLen == data.count {
                body = base + data.lowerBound  // already canonical: the bytes as written
            } else {
                let out = box().reserve(data.count)  // the walk's room (see `RawJSON.canonical`)
                _ = RawJSON.canonical(t, at: data.lowerBound, into: out, scratch: &scratch.canonical)
                body = UnsafeRawPointer(out)
            }
            var ts = wall
            if let s = r.ts, let v = RawJSON.integer(t, s) {
                // The backend refuses a negative ts (400), as it does a bad id.
                guard v >= 0 else {
                    p.records = .failure(tsError(i))
                    return p
                }
                ts = v
            }
            bytes += Chunk.estimatedCharge(idBytes: idCount, dataBytes: bodyLen)
            records.append(
                PendingRecord(
                    id: idStart.assumingMemoryBound(to: CChar.self), idLength: Int32(idCount),
                    ts: ts, body: body.assumingMemoryBound(to: CChar.self), bodyLength: Int32(bodyLen)))
        }
        p.records = .success((records, bytes))
        return p
    }

    /// One element of `records` as the walk saw it: its span, and the spans of its `id`, `ts`
    /// and `data` members (the last of each), with the length of `data`'s canonical form.
    struct RawRecord {
        var span: Range<Int>
        var id: Range<Int>?
        var ts: Range<Int>?
        var data: Range<Int>?
        var dataLength = 0
    }

    /// Walks the records array at `start` once into `scratch.records`: each record's members,
    /// and `data` through `RawJSON.canonical` (which both measures and skips it). Keeps the first
    /// `keep` records (the rest are only skipped, to find the end). Returns the index past the
    /// array.
    private static func walkRecords(_ t: UnsafeRawBufferPointer, at start: Int, keep: Int, into scratch: inout Scratch) -> Int {
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
                if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "id") {
                    r.id = members.skipValue()
                } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "ts") {
                    r.ts = members.skipValue()
                } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "data") {
                    let (length, end) = RawJSON.canonical(t, at: m.valueStart, scratch: &scratch.canonical)
                    r.data = m.valueStart..<end
                    r.dataLength = length
                    members.resume(at: end)
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
