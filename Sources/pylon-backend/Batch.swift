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
        let json = try parseJSONBody(body)
        guard let o = json.objectValue else { throw invalid("body must be a JSON object") }
        if let b = o["batch"], b.stringValue != key {
            throw invalid("\"batch\" must be a string equal to the Idempotency-Key header")
        }
        if let s = o["stream"], s.stringValue != stream {
            throw invalid("\"stream\" must be a string equal to the stream in the path")
        }
        guard let list = o["records"]?.arrayValue else { throw invalid("\"records\" must be an array") }
        var records: [Record] = []
        records.reserveCapacity(list.count)
        for (i, r) in list.enumerated() {
            guard let ro = r.objectValue else { throw invalid("records[\(i)] must be an object") }
            guard let id = ro["id"]?.stringValue else { throw invalid("records[\(i)].id must be a string") }
            if let why = Router.invalidName(id, what: "records[\(i)].id") { throw invalid(why) }
            guard let ts = ro["ts"]?.intValue, ts >= 0 else {
                throw invalid("records[\(i)].ts must be a non-negative integer (milliseconds)")
            }
            records.append(Record(id: id, ts: ts, data: (ro["data"] ?? .null).serialized))
        }
        return Batch(key: key, stream: stream, records: records)
    }

    private static func invalid(_ message: String) -> APIError { .badRequest(.invalidBatch, message) }
}

/// Parses a request body as one JSON text with json-c (depth `Limits.maxJSONDepth`, UTF-8
/// validated). Throws 400 `invalid_json`.
func parseJSONBody(_ body: [UInt8]) throws(APIError) -> JSON {
    let r: Result<JSON, JSONParseError> = body.withUnsafeBytes { b in
        do throws(JSONParseError) {
            return .success(try JSONRef.parse(b, maxDepth: Limits.maxJSONDepth).json)
        } catch {
            return .failure(error)
        }
    }
    switch r {
    case .success(let json): return json
    case .failure(let e): throw .badRequest(.invalidJSON, "body is not valid JSON: \(e.detail)")
    }
}
