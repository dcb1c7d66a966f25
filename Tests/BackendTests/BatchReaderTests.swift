import PylonCore
import PylonStore
import TestSupport
import Testing

@testable import PylonBackend

/// The two readers of a batch body agree: whatever the raw reader (the body's bytes) decides is
/// what the json-c reader decides — the same error (status, code and message), or the same
/// records (ids, ts, and the stored bytes of their data) — it decides ordinary bodies itself,
/// and what either reads is stored as the same rows.
struct BatchReaderTests {
    static let key = "k-1"
    static let stream = "s.events"

    /// One reader's outcome as comparable text.
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

    /// Both readers on `text`: (json-c's outcome, the raw reader's or nil when it declined).
    static func outcomes(_ text: String, key: String = key, stream: String = stream) -> (jsonC: String, raw: String?) {
        let body = Array(text.utf8)
        let tree: Result<Batch, APIError>
        do throws(APIError) {
            tree = .success(try Batch.read(tree: body, key: key, stream: stream))
        } catch {
            tree = .failure(error)
        }
        return (describe(tree), Batch.read(raw: body, key: key, stream: stream).map(describe))
    }

    @Test func randomBodiesGiveTheSameOutcomeThroughBothReaders() {
        var g = BatchGenerator(seed: 2026)
        var decided = 0
        var declined = 0
        var accepted = 0
        for _ in 0..<8000 {
            let text = g.body()
            let (viaJSONC, viaRaw) = Self.outcomes(text)
            if let viaRaw {
                #expect(viaRaw == viaJSONC, "\(text)")
                decided += 1
                if viaRaw.hasPrefix("batch ") { accepted += 1 }
            } else {
                declined += 1
            }
            // What the backend uses is always json-c's answer.
            let parsed: String
            do throws(APIError) {
                parsed = Self.describe(.success(try Batch.parse(Array(text.utf8), key: Self.key, stream: Self.stream)))
            } catch {
                parsed = Self.describe(.failure(error))
            }
            #expect(parsed == viaJSONC, "\(text)")
        }
        #expect(decided > 4000 && declined > 500 && accepted > 1000, "decided \(decided), declined \(declined), accepted \(accepted)")
    }

    @Test func ordinaryBodiesAreReadFromTheBytes() {
        let cases = [
            // As the uploader sends them.
            #"{"batch":"k-1","stream":"s.events","records":[{"id":"r1","ts":1764000000000,"data":{"event":"purchase","price":9.99,"n":-3,"tags":["a","b"],"ok":true,"none":null}},{"id":"r2","ts":0,"data":"x"}]}"#,
            #"{"records":[{"id":"a","ts":5},{"ts":6,"id":"b","data":null},{"id":"c","ts":7,"data":[]}]}"#,
            // Pretty-printed: stored compact, as json-c prints it.
            #"{ "records" : [ { "id" : "a" , "ts" : 1 , "data" : { "k" : [ 1 , 2 ] , "u" : "é 😀 \n\t\"q\"" } } ] }"#,
            #"{"records":[]}"#,
        ]
        for text in cases {
            let (viaJSONC, viaRaw) = Self.outcomes(text)
            #expect(viaRaw == viaJSONC, "\(text)")
            #expect(viaRaw != nil && viaJSONC.hasPrefix("batch "), "\(text) -> \(viaJSONC)")
        }
        #expect(Self.outcomes(cases[2]).raw?.hasSuffix(#"[a|1|{"k":[1,2],"u":"é 😀 \n\t\"q\""}]"#) == true)
    }

    @Test func whatOnlyJsonCCanDecideIsLeftToIt() {
        let cases = [
            #"{"records":[{"id":"a","ts":1,"data":1}],}"#,  // not JSON
            #"[{"id":"a","ts":1}]"#,  // not an object
            #"{"b\u0061tch":"k-1","records":[]}"#,  // key with an escape
            #"{"batch":"k\u002d1","records":[]}"#,  // batch with an escape
            #"{"stream":"s\u002eevents","records":[]}"#,
            #"{"records":[{"\u0069d":"a","ts":1}]}"#,
            #"{"records":[{"id":"a\u0062","ts":1}]}"#,  // id with an escape
            #"{"records":[{"id":"a","ts":1,"data":"x\/y"}]}"#,  // json-c prints x/y
            #"{"records":[{"id":"a","ts":1,"data":"\u00e9"}]}"#,  // json-c prints é
            #"{"records":[{"id":"a","ts":1,"data":{"k":1,"k":2}}]}"#,  // json-c keeps the last
            #"{"records":[{"id":"a","ts":1,"data":-0}]}"#,  // json-c prints 0
            #"{"records":[{"id":"a","ts":1,"data":123456789012345678901}]}"#,  // json-c clamps
            #"{"records":[{"id":"a","ts":99999999999999999999}]}"#,  // json-c clamps
        ]
        for text in cases {
            let (viaJSONC, viaRaw) = Self.outcomes(text)
            #expect(viaRaw == nil, "\(text) -> \(viaJSONC)")
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
            // Repeated keys: the last wins, as in json-c.
            (#"{"records":7,"records":[{"id":"a","id":"b","ts":-1,"ts":2,"data":1,"data":{"x":[ 1 ]}}]}"#, #"[b|2|{"x":[1]}]"#),
        ]
        for (text, expected) in cases {
            let (viaJSONC, viaRaw) = Self.outcomes(text)
            #expect(viaJSONC.contains(expected), "\(text) -> \(viaJSONC)")
            if let viaRaw { #expect(viaRaw == viaJSONC, "\(text)") }
        }
        let longID = String(repeating: "i", count: Limits.maxNameBytes + 1)
        let (viaJSONC, viaRaw) = Self.outcomes(#"{"records":[{"id":"\#(longID)","ts":1}]}"#)
        #expect(viaJSONC.contains("records[0].id exceeds \(Limits.maxNameBytes) bytes"))
        #expect(viaRaw == viaJSONC)
    }

    /// Around json-c's depth limit (`Limits.maxJSONDepth`) the raw reader declines or agrees.
    @Test func nestingAroundTheDepthLimit() {
        for depth in (Int(Limits.maxJSONDepth) - 4)...(Int(Limits.maxJSONDepth) + 2) {
            let data = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
            let (viaJSONC, viaRaw) = Self.outcomes(#"{"records":[{"id":"a","ts":1,"data":"# + data + "}]}")
            if let viaRaw { #expect(viaRaw == viaJSONC, "depth \(depth)") }
            // The body's own levels: the object, the records array, a record, then data.
            #expect(
                viaJSONC.hasPrefix(depth + 3 <= Int(Limits.maxJSONDepth) ? "batch " : "error 400 invalid_json"),
                "depth \(depth): \(viaJSONC)")
        }
    }

    /// A page of records ends after the record that reaches the byte budget, and `after` goes on.
    @Test func aPageOfRecordsIsBoundedInBytes() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let big = String(repeating: "x", count: 1000)
        let records = (0..<5).map { #"{"id":"r\#($0)","ts":1,"data":""# + big + #""}"# }
        let body = #"{"batch":"k","stream":"s.events","records":["# + records.joined(separator: ",") + "]}"
        guard case .success(let batch)? = Batch.read(raw: Array(body.utf8), key: "k", stream: Self.stream) else {
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

    /// Bodies read either way are stored as the same rows, counted the same.
    @Test func bothReadersStoreTheSameRows() throws {
        var g = BatchGenerator(seed: 7)
        let viaRaw = try Store(path: ":memory:")
        let viaJSONC = try Store(path: ":memory:")
        defer {
            viaRaw.close()
            viaJSONC.close()
        }
        var stored = 0
        for n in 0..<3000 {
            let text = g.body()
            let body = Array(text.utf8)
            guard case .success(var raw)? = Batch.read(raw: body, key: Self.key, stream: Self.stream),
                var tree = try? Batch.read(tree: body, key: Self.key, stream: Self.stream)
            else { continue }
            raw.key = "k\(n % 500)"  // some keys repeat: duplicate batches
            tree.key = raw.key
            let a = try viaRaw.ingest(raw, receivedAt: 1)
            let b = try viaJSONC.ingest(tree, receivedAt: 1)
            #expect(a == b, "\(text)")
            stored += a.accepted
        }
        #expect(stored > 300)
        let rowsA = try viaRaw.records(stream: Self.stream, after: 0, limit: 100_000)
        let rowsB = try viaJSONC.records(stream: Self.stream, after: 0, limit: 100_000)
        #expect(rowsA.count == stored)
        #expect(rowsA.map { "\($0.seq) \($0.id) \($0.ts) \($0.data)" } == rowsB.map { "\($0.seq) \($0.id) \($0.ts) \($0.data)" })
        #expect(try viaRaw.summary(stream: Self.stream) == viaJSONC.summary(stream: Self.stream))
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
