import PylonCore
import PylonStore
import TestSupport
import Testing

@testable import PylonBackend

/// The one reader of a batch body (`Batch.read(raw:)`): on random bodies, what it reads is what
/// json-c reads (json-c is the oracle: the batch rules on json-c's tree give the same error —
/// status, code and message, `invalid_json` by code — or the same records: ids, ts, and data
/// json-c reads as the same value), and the data it stores is canonical.
struct BatchReaderTests {
    static let key = "k-1"
    static let stream = "s.events"

    /// The reader's outcome as comparable text.
    static func describe(_ r: Result<Batch, APIError>) -> String {
        switch r {
        case .failure(let e): return "error \(e.status) \(e.code.rawValue) \(e.message)"
        case .success(let b):
            var s = "batch \(b.key) \(b.stream) \(b.records.count):"
            for rec in b.records {
                let id = String(decoding: b.text[rec.id], as: UTF8.self)
                let data = rec.data.map { String(decoding: b.text[$0], as: UTF8.self) } ?? "null"
                s += " [\(id)|\(rec.ts)|\(data)]"
            }
            return s
        }
    }

    static func outcome(_ text: String, key: String = key, stream: String = stream) -> String {
        describe(Batch.read(raw: Array(text.utf8), key: key, stream: stream))
    }

    /// The batch rules on json-c's reading of a body (the oracle): the error, or each record's
    /// (id, ts, data value; nil when absent or null).
    static func expected(_ text: String) -> Result<[(id: String, ts: Int64, data: JSON?)], APIError> {
        guard let j = Array(text.utf8).withUnsafeBytes({ try? JSONRef.parse($0, maxDepth: Limits.maxJSONDepth) })?.json else {
            return .failure(.badRequest(.invalidJSON, "body is not valid JSON"))
        }
        guard case .object(let o) = j else { return .failure(Batch.invalid("body must be a JSON object")) }
        if o.keys.contains("batch"), j["batch"]?.stringValue != key { return .failure(Batch.batchMismatch) }
        if o.keys.contains("stream"), j["stream"]?.stringValue != stream { return .failure(Batch.streamMismatch) }
        guard case .array(let list)? = j["records"] else { return .failure(Batch.recordsNotArray) }
        var out: [(id: String, ts: Int64, data: JSON?)] = []
        for (i, r) in list.enumerated() {
            guard case .object = r else { return .failure(Batch.notObject(i)) }
            guard case .string(let id)? = r["id"] else { return .failure(Batch.idNotString(i)) }
            if let why = Array(id.utf8).withUnsafeBytes({ Router.invalidName($0, what: Batch.recordID(i)) }) {
                return .failure(Batch.invalid(why))
            }
            guard case .int(let ts)? = r["ts"], ts >= 0 else { return .failure(Batch.badTS(i)) }
            out.append((id, ts, r["data"].flatMap { $0 == .null ? nil : $0 }))
        }
        return .success(out)
    }

    @Test func randomBodiesReadAsJsonCReadsThem() {
        var g = BatchGenerator(seed: 2026)
        var accepted = 0
        var refused = 0
        for _ in 0..<PropertyRuns.count(8000) {
            let text = g.body()
            let bytes = Array(text.utf8)
            let got = Batch.read(raw: bytes, key: Self.key, stream: Self.stream)
            switch (got, Self.expected(text)) {
            case (.failure(let a), .failure(let b)):
                if b.code == .invalidJSON {
                    #expect(a.code == .invalidJSON && a.message.hasPrefix(b.message), "\(text): \(a.message)")
                } else {
                    #expect(a.status == b.status && a.code == b.code && a.message == b.message, "\(text): \(a.message) / \(b.message)")
                }
                refused += 1
            case (.success(let batch), .success(let want)):
                #expect(batch.records.count == want.count, "\(text)")
                for (r, e) in zip(batch.records, want) {
                    #expect(String(decoding: batch.text[r.id], as: UTF8.self) == e.id && r.ts == e.ts, "\(text)")
                    if let d = r.data {
                        let stored = Array(batch.text[d])
                        #expect(
                            (try? JSON.parse(String(decoding: stored, as: UTF8.self)))?.isSameValue(as: e.data ?? .null) == true, "\(text)")
                        #expect(stored.withUnsafeBytes { RawJSON.canonicalBytes($0) } == stored, "not canonical: \(text)")
                    } else {
                        #expect(e.data == nil, "\(text)")
                    }
                }
                accepted += 1
            case (let a, let b):
                Issue.record("\(text): \(Self.describe(a)) / \(b)")
            }
        }
        #expect(
            accepted > PropertyRuns.share(1000, of: 8000) && refused > PropertyRuns.share(1000, of: 8000),
            "accepted \(accepted), refused \(refused)")
    }

    @Test func bodiesAreStoredCanonical() {
        let cases: [(String, String)] = [
            // As the uploader sends them: stored as written.
            (
                #"{"batch":"k-1","stream":"s.events","records":[{"id":"r1","ts":1764000000000,"data":{"event":"purchase","price":9.99,"n":-3,"tags":["a","b"],"ok":true,"none":null}},{"id":"r2","ts":0,"data":"x"}]}"#,
                #"[r1|1764000000000|{"event":"purchase","price":9.99,"n":-3,"tags":["a","b"],"ok":true,"none":null}] [r2|0|"x"]"#
            ),
            (
                #"{"records":[{"id":"a","ts":5},{"ts":6,"id":"b","data":null},{"id":"c","ts":7,"data":[]}]}"#,
                "[a|5|null] [b|6|null] [c|7|[]]"
            ),
            // Pretty-printed: stored compact, escapes as written.
            (
                #"{ "records" : [ { "id" : "a" , "ts" : 1 , "data" : { "k" : [ 1 , 2 ] , "u" : "é 😀 \n\t\"q\" \/ \u00e9" } } ] }"#,
                #"[a|1|{"k":[1,2],"u":"é 😀 \n\t\"q\" \/ \u00e9"}]"#
            ),
            (#"{"records":[]}"#, "batch k-1 s.events 0:"),
            // Numbers as written; a repeated key: its last member only.
            (
                #"{"records":[{"id":"a","ts":1,"data":[-0,123456789012345678901,{"k":1,"k":2}]}]}"#,
                #"[a|1|[-0,123456789012345678901,{"k":2}]]"#
            ),
            // Keys, ids, batch and stream decoded.
            (
                #"{"b\u0061tch":"k\u002d1","stream":"s\u002eevents","records":[{"\u0069d":"a\u0062","ts":99999999999999999999}]}"#,
                "[ab|\(Int64.max)|null]"
            ),
        ]
        for (text, expected) in cases {
            let got = Self.outcome(text)
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
    }

    @Test func errorsAreWordedAsBefore() {
        let cases: [(String, String)] = [
            (#"{"records":[{"id":"a","ts":1}],}"#, "error 400 invalid_json body is not valid JSON"),
            ("[1]", "error 400 invalid_batch body must be a JSON object"),
            (#"{"batch":"other","records":[]}"#, "\"batch\" must be a string equal to the Idempotency-Key header"),
            (#"{"batch":7,"records":[]}"#, "\"batch\" must be a string equal to the Idempotency-Key header"),
            (#"{"stream":"other","records":[]}"#, "\"stream\" must be a string equal to the stream in the path"),
            (#"{"stream":null,"records":[]}"#, "\"stream\" must be a string equal to the stream in the path"),
            (#"{"records":{}}"#, "\"records\" must be an array"),
            (#"{}"#, "\"records\" must be an array"),
            (#"{"records":[{"id":"a","ts":1}],"records":7}"#, "\"records\" must be an array"),
            (#"{"records":[{"id":"a","ts":1},7]}"#, "records[1] must be an object"),
            (#"{"records":[{"ts":1}]}"#, "records[0].id must be a string"),
            (#"{"records":[{"id":5,"ts":1}]}"#, "records[0].id must be a string"),
            (#"{"records":[{"id":"","ts":1}]}"#, "records[0].id is empty"),
            (#"{"records":[{"id":"a"},{"id":"b\u007f","ts":1}]}"#, "records[0].ts must be a non-negative integer (milliseconds)"),
            ("{\"records\":[{\"id\":\"a\",\"ts\":1},{\"id\":\"b\u{7f}\",\"ts\":1}]}", "records[1].id contains control characters"),
            (#"{"records":[{"id":"a","ts":-1}]}"#, "records[0].ts must be a non-negative integer"),
            (#"{"records":[{"id":"a","ts":1.5}]}"#, "records[0].ts must be a non-negative integer"),
            (#"{"records":[{"id":"a","ts":1e3}]}"#, "records[0].ts must be a non-negative integer"),
            (#"{"records":[{"id":"a","ts":"1"}]}"#, "records[0].ts must be a non-negative integer"),
            // The first error in the body's order, after the top-level checks.
            (#"{"records":[{"id":"a","ts":1},{"id":""}],"batch":"other"}"#, "\"batch\" must be a string"),
            (#"{"records":[{"id":"a","ts":1,"data":{"k":1,"k":2}},{"id":""}]}"#, "records[1].id is empty"),
            // Not JSON (RFC 8259, strictly), whatever json-c accepts.
            ("{'records':[]}", "error 400 invalid_json body is not valid JSON"),
            (#"{"records":[{"id":"a","ts":2.}]}"#, "error 400 invalid_json body is not valid JSON"),
            ("{\"records\":[{\"id\":\"a\u{1}\",\"ts\":1}]}", "error 400 invalid_json body is not valid JSON"),
            // An id decoded: control characters refused however they are written.
            (#"{"records":[{"id":"a\u0000b","ts":1}]}"#, "records[0].id contains control characters"),
            // Repeated keys: the last wins.
            (#"{"records":7,"records":[{"id":"a","id":"b","ts":-1,"ts":2,"data":1,"data":{"x":[ 1 ]}}]}"#, #"[b|2|{"x":[1]}]"#),
        ]
        for (text, expected) in cases {
            let got = Self.outcome(text)
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
        // Invalid UTF-8 (a lone 0xFF byte in the id).
        let badUTF8 = Array(#"{"records":[{"id":""#.utf8) + [0xFF] + Array(#"","ts":1}]}"#.utf8)
        #expect(Self.describe(Batch.read(raw: badUTF8, key: Self.key, stream: Self.stream)).hasPrefix("error 400 invalid_json"))
        let longID = String(repeating: "i", count: Limits.maxNameBytes + 1)
        #expect(Self.outcome(#"{"records":[{"id":"\#(longID)","ts":1}]}"#).contains("records[0].id exceeds \(Limits.maxNameBytes) bytes"))
    }

    /// Around the depth limit (`Limits.maxJSONDepth`, as json-c counts it) the reader decides
    /// as json-c does.
    @Test func nestingAroundTheDepthLimit() {
        for depth in (Int(Limits.maxJSONDepth) - 4)...(Int(Limits.maxJSONDepth) + 2) {
            let data = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
            let got = Self.outcome(#"{"records":[{"id":"a","ts":1,"data":"# + data + "}]}")
            // The body's own levels: the object, the records array, a record, then data.
            #expect(got.hasPrefix(depth + 3 <= Int(Limits.maxJSONDepth) ? "batch " : "error 400 invalid_json"), "depth \(depth): \(got)")
            let viaJSONC = Self.expected(#"{"records":[{"id":"a","ts":1,"data":"# + data + "}]}")
            #expect(got.hasPrefix("batch ") == ((try? viaJSONC.get()) != nil), "depth \(depth)")
        }
    }

    /// A page of records ends after the record that reaches the byte budget, and `after` goes on.
    @Test func aPageOfRecordsIsBoundedInBytes() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let big = String(repeating: "x", count: 1000)
        let records = (0..<5).map { #"{"id":"r\#($0)","ts":1,"data":""# + big + #""}"# }
        let body = #"{"batch":"k","stream":"s.events","records":["# + records.joined(separator: ",") + "]}"
        guard case .success(let batch) = Batch.read(raw: Array(body.utf8), key: "k", stream: Self.stream) else {
            Issue.record("the body was not read")
            return
        }
        _ = try store.ingest(batch, receivedAt: 1)
        let first = try store.records(stream: Self.stream, after: 0, limit: 100, maxBytes: 2500)
        #expect(first.map(\.id) == ["r0", "r1", "r2"], "the third record passes 2,500 bytes and ends the page")
        let rest = try store.records(stream: Self.stream, after: first.last!.seq, limit: 100, maxBytes: 2500)
        #expect(rest.map(\.id) == ["r3", "r4"])
        #expect(try store.records(stream: Self.stream, after: 0, limit: 100, maxBytes: 1).map(\.id) == ["r0"], "at least one")
    }
}

/// Random batch bodies as text: valid and invalid, with the spellings json-c reads the same but
/// prints differently (whitespace, escapes, repeated keys, `-0`, integers beyond Int64).
struct BatchGenerator {
    var text: RandomJSONText
    var serial = 0
    init(seed: UInt64) {
        text = RandomJSONText(
            seed: seed,
            odds: .init(
                plainSpacePercent: 88, escapePercent: 6,
                plainChars: ["a", "Z", "0", " ", "é", "日本", "😀", #"\n"#, #"\""#, #"\\"#, "\u{7f}", ",", "}", "]", #"\t"#],
                oddNumberPercent: 6, oddNumbers: RandomJSONText.oddNumbers, plainNumbers: RandomJSONText.plainNumbers,
                maxKeys: 5, keyNames: 5, repeatKeyPercent: 4, escapedKeyPercent: 3))
    }

    mutating func id() -> String? {
        switch text.int(60) {
        case 0: return nil
        case 1: return "\"\""
        case 2: return "\"" + String(repeating: "x", count: Limits.maxNameBytes) + "\""
        case 3: return "\"" + String(repeating: "y", count: Limits.maxNameBytes + 1) + "\""
        case 4: return #""a\u0062""#
        case 5: return #""q\"d""#
        case 6: return text.number()
        case 7: return "null"
        case 8: return "\"d\u{7f}\""
        case 9: return #""t\u0001""#
        case 10: return "\"é\(text.int(50))\""
        default:
            serial += 1
            return "\"r\(text.chance(10) ? serial / 2 : serial)\""  // some ids repeat
        }
    }

    mutating func ts() -> String? {
        switch text.int(50) {
        case 0: return nil
        case 1: return "-1"
        case 2: return "-0"
        case 3: return "1.5"
        case 4: return "2e3"
        case 5: return "99999999999999999999"
        case 6: return "\"5\""
        case 7: return "null"
        case 8: return "9223372036854775807"
        default: return String(1_764_000_000_000 + text.int(100_000))
        }
    }

    mutating func record() -> String {
        if text.chance(1) { return text.pick(["7", "null", "[]", "\"r\""]) }
        var members: [String] = []
        if let id = id() { members.append(#""id":"# + text.space() + id) }
        if let ts = ts() { members.append(#""ts":"# + text.space() + ts) }
        if text.chance(85) { members.append(#""data":"# + text.space() + text.value()) }
        if text.chance(10) { members.append("\"extra\":" + text.value()) }
        if text.chance(3) { members.append(text.pick([#""id":"r-again""#, #""ts":1"#, #""data":{"again":true}"#])) }
        if text.chance(2) { members.append(#""\u0069d":"esc""#) }
        text.shuffle(&members)
        return "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
    }

    mutating func body() -> String {
        if text.chance(2) { return text.pick(["[]", "7", "\"x\"", "null", "", "{", #"{"records":[}"#]) }
        var members: [String] = []
        switch text.int(14) {
        case 0: break
        case 1: members.append(#""batch":"other""#)
        case 2: members.append(#""batch":7"#)
        case 3: members.append(#""batch":"k\u002d1""#)
        default: if text.chance(60) { members.append(#""batch":"k-1""#) }
        }
        switch text.int(14) {
        case 0: members.append(#""stream":"other""#)
        case 1: members.append(#""stream":[]"#)
        case 2: members.append(#""stream":"s.\u0065vents""#)
        default: if text.chance(60) { members.append(#""stream":"s.events""#) }
        }
        switch text.int(20) {
        case 0: break
        case 1: members.append(#""records":{}"#)
        case 2: members.append(#""records":[{"id":"z","ts":1}],"records":"x""#)
        default:
            members.append(
                #""records":["# + (0..<text.int(8)).map { _ in text.space() + record() + text.space() }.joined(separator: ",") + "]")
        }
        if text.chance(10) { members.append(#""other":"# + text.value()) }
        text.shuffle(&members)
        var body = "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
        if text.chance(2) { body += text.pick([" x", ",", "}"]) }
        if text.chance(3) { body = text.space() + body + "\n" }
        return body
    }
}
