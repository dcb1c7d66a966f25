import CJSONC
import PylonCore

/// A validated ingest batch, ready to store.
struct Batch {
    struct Record {
        var id: String
        var ts: Int64
        /// The record's `data`, re-serialised compactly by json-c (`null` when absent).
        var data: String
    }

    var key: String
    var stream: String
    var records: [Record]

    /// Parses and validates a batch body:
    /// `{"batch": key?, "stream": stream?, "records": [{"id": String, "ts": Int, "data": Any?}]}`.
    /// `batch` and `stream`, when present, must equal the `Idempotency-Key` header and the
    /// stream in the path. Throws 400 `invalid_json` or `invalid_batch`.
    static func parse(_ body: [UInt8], key: String, stream: String) throws(APIError) -> Batch {
        // Read straight from json-c's tree: no Swift JSON per record (the ingest hot path).
        let root = try parseJSONBodyRef(body)
        guard json_object_get_type(root.ptr) == json_type_object else { throw invalid("body must be a JSON object") }
        if root.has("batch"), string(root.member("batch")) != key {
            throw invalid("\"batch\" must be a string equal to the Idempotency-Key header")
        }
        if root.has("stream"), string(root.member("stream")) != stream {
            throw invalid("\"stream\" must be a string equal to the stream in the path")
        }
        let list = root.member("records")
        guard json_object_get_type(list) == json_type_array else { throw invalid("\"records\" must be an array") }
        let n = json_object_array_length(list)
        var records: [Record] = []
        records.reserveCapacity(n)
        for i in 0..<n {
            let r = json_object_array_get_idx(list, i)
            guard json_object_get_type(r) == json_type_object else { throw invalid("records[\(i)] must be an object") }
            guard let id = string(member(r, "id")) else { throw invalid("records[\(i)].id must be a string") }
            if let why = Router.invalidName(id, what: "records[\(i)].id") { throw invalid(why) }
            let tsObj = member(r, "ts")
            guard json_object_get_type(tsObj) == json_type_int, case let ts = json_object_get_int64(tsObj), ts >= 0 else {
                throw invalid("records[\(i)].ts must be a non-negative integer (milliseconds)")
            }
            var len = 0
            let data =
                member(r, "data").flatMap { json_object_to_json_string_length($0, flagsPlain, &len) }
                .map { String(cString: $0) } ?? "null"
            records.append(Record(id: id, ts: ts, data: data))
        }
        return Batch(key: key, stream: stream, records: records)
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

    private static func invalid(_ message: String) -> APIError { .badRequest(.invalidBatch, message) }
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
