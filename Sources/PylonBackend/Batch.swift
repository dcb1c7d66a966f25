import CJSONC
import PylonCore

/// A validated ingest batch, ready to store: its records' ids and data as byte ranges of one
/// buffer, so storing a record binds bytes and builds no Swift value.
///
/// Read by one of two readers that agree on every body: `read(raw:)` walks the body's bytes
/// (the ingest hot path: no tree, no per-record allocation) and declines (nil) whenever the bytes
/// alone cannot say what json-c would read; `read(tree:)` parses with json-c and decides
/// everything, with the same checks, in the same order, worded the same.
struct Batch {
    struct Record {
        /// The id's bytes (UTF-8, no escapes) in `text`.
        var id: Range<Int>
        var ts: Int64
        /// The record's `data` as json-c prints it compactly (`flagsPlain`), in `text`; nil when
        /// absent or `null` (stored as `null`).
        var data: Range<Int>?
    }

    var key: String
    var stream: String
    /// The bytes the records' ranges point into: the body itself (raw reader), possibly with
    /// compacted data appended, or the ids and data json-c gave (tree reader).
    var text: [UInt8]
    var records: [Record]

    /// Parses and validates a batch body:
    /// `{"batch": key?, "stream": stream?, "records": [{"id": String, "ts": Int, "data": Any?}]}`.
    /// `batch` and `stream`, when present, must equal the `Idempotency-Key` header and the
    /// stream in the path. Throws 400 `invalid_json` or `invalid_batch`.
    static func parse(_ body: [UInt8], key: String, stream: String) throws(APIError) -> Batch {
        if let decided = read(raw: body, key: key, stream: stream) { return try decided.get() }
        return try read(tree: body, key: key, stream: stream)
    }

    // MARK: From json-c's tree

    /// Reads a body through json-c: the reference reader, and the one for every body the raw
    /// reader declines (invalid JSON, escapes, numbers json-c rewrites, repeated keys in data).
    static func read(tree body: [UInt8], key: String, stream: String) throws(APIError) -> Batch {
        let root = try parseJSONBodyRef(body)
        guard json_object_get_type(root.ptr) == json_type_object else { throw invalid("body must be a JSON object") }
        if root.has("batch"), string(root.member("batch")) != key { throw batchMismatch }
        if root.has("stream"), string(root.member("stream")) != stream { throw streamMismatch }
        let list = root.member("records")
        guard json_object_get_type(list) == json_type_array else { throw recordsNotArray }
        let n = json_object_array_length(list)
        var batch = Batch(key: key, stream: stream, text: [], records: [])
        batch.records.reserveCapacity(n)
        for i in 0..<n {
            let r = json_object_array_get_idx(list, i)
            guard json_object_get_type(r) == json_type_object else { throw notObject(i) }
            let idObj = member(r, "id")
            guard json_object_get_type(idObj) == json_type_string else { throw idNotString(i) }
            // The whole string, with its length (a `\u0000` inside must not cut it short).
            let idBytes = UnsafeRawBufferPointer(start: json_object_get_string(idObj), count: Int(json_object_get_string_len(idObj)))
            if let why = Router.invalidName(idBytes, what: recordID(i)) { throw invalid(why) }
            let tsObj = member(r, "ts")
            guard json_object_get_type(tsObj) == json_type_int, case let ts = json_object_get_int64(tsObj), ts >= 0 else {
                throw badTS(i)
            }
            let id = batch.append(idBytes)
            var data: Range<Int>?
            if let d = member(r, "data") {
                var len = 0
                let p = json_object_to_json_string_length(d, flagsPlain, &len)
                data = batch.append(UnsafeRawBufferPointer(start: p, count: len))
            }
            batch.records.append(Record(id: id, ts: ts, data: data))
        }
        return batch
    }

    private mutating func append(_ bytes: UnsafeRawBufferPointer) -> Range<Int> {
        let start = text.count
        text.append(contentsOf: bytes)
        return start..<text.count
    }

    private static func member(_ o: OpaquePointer?, _ key: String) -> OpaquePointer? {
        var v: OpaquePointer?
        return json_object_object_get_ex(o, key, &v) != 0 ? v : nil
    }

    /// The whole string, with its length (a `\u0000` inside must not cut it short).
    private static func string(_ v: OpaquePointer?) -> String? {
        guard json_object_get_type(v) == json_type_string else { return nil }
        return String(
            decoding: UnsafeRawBufferPointer(start: json_object_get_string(v), count: Int(json_object_get_string_len(v))),
            as: UTF8.self)
    }

    // MARK: Errors, worded once for both readers

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
