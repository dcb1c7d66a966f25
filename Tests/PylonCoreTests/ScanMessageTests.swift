import Testing

@testable import PylonCore

/// `RawJSON.classifyMessage`, the host's one-pass validator: it may only accept what the strict
/// json-c tokener accepts, and its spans must be the bytes json-c would use.
@Suite struct ScanMessageTests {
    func scan(_ s: String, depth: Int = 32) -> MessageSpans? {
        let b = Array(s.utf8)
        return b.withUnsafeBytes { RawJSON.spans($0, maxDepth: depth) }
    }

    func text(_ s: String, _ r: Range<Int>?) -> String? {
        r.map { String(decoding: Array(s.utf8)[$0], as: UTF8.self) }
    }

    func jsonCAccepts(_ s: String) -> Bool {
        let b = Array(s.utf8)
        return b.withUnsafeBytes { (try? Tokener(maxDepth: 64).parse($0)) != nil }
    }

    static let good = [
        #"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"a":[1,2.5,-3e2,true,false,null,"x"]}}"#,
        #" { "jsonrpc" : "2.0" , "id" : "abc" , "method" : "m" } "#,
        #"{"jsonrpc":"2.0","id":7,"result":{"code":0,"message":""}}"#,
        #"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"nope"}}"#,
        #"{"jsonrpc":"2.0","method":"note","params":["caf\u00e9","\n\t\"\\\/"]}"#,
        "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"m\",\"params\":{\"s\":\"h\u{e9}llo \u{1F600} \u{4E2D}\"}}",
        #"{}"#,
        #"{"id":0,"x":1,"x":-0.5E+3}"#,
        #"{"\u0069d":1,"a":"\ud83d\ude00"}"#,
    ]

    @Test(arguments: good)
    func acceptsWellFormedMessages(_ s: String) {
        #expect(scan(s) != nil, "\(s)")
        #expect(jsonCAccepts(s))
    }

    @Test func spansAreTheValueBytesAndTheLastDuplicateWins() throws {
        let s = #"{"jsonrpc":"2.0", "id" : "last" ,"method":"a.b","params":{"id":9,"id":10},"x":1,"x":2}"#
        let m = try #require(scan(s))
        #expect(text(s, m.id) == #""last""#)
        #expect(text(s, m.method) == #""a.b""#)
        #expect(text(s, m.params) == #"{"id":9,"id":10}"#)
        #expect(text(s, m.jsonrpc) == #""2.0""#)
        #expect(m.result == nil && m.error == nil)
        let b = Array(s.utf8)
        #expect(b.withUnsafeBytes { RawJSON.memberValueSpan($0, key: "id") } == m.id, "the same bytes as the plain-key search")
    }

    static let unsure = [
        "", "   ", "[1,2]", "42", #""str""#, "{", #"{"a":1"#, #"{"a":1,}"#, #"{"a" 1}"#, #"{"a":01}"#,
        #"{"a":1.}"#, #"{"a":.5}"#, #"{"a":-}"#, #"{"a":1e}"#, #"{"a":tru}"#, #"{"a":nul}"#, #"{"a":NaN}"#,
        #"{"a":Infinity}"#, #"{'a':1}"#, #"{"a":'x'}"#, #"{"a":"\x"}"#, #"{"a":"\u12"}"#,
        "{\"a\":\"tab\there\"}", #"{"a":1} x"#, #"{"a":1}{"b":2}"#, #"{"a":[1,2,]}"#, #"{"a":1 2}"#,
        #"{"a":12a}"#, #"{"a":[}"#, #"{"a":{"b"}}"#,
    ]

    @Test(arguments: unsure)
    func refusesWhatItCannotVouchFor(_ s: String) {
        #expect(scan(s) == nil, "\(s)")
    }

    @Test func invalidUTF8IsRefused() {
        for bad: [UInt8] in [[0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xE2, 0x82], [0xFF], [0x80]] {
            let line = Array(#"{"a":""#.utf8) + bad + Array(#""}"#.utf8)
            #expect(line.withUnsafeBytes { RawJSON.spans($0, maxDepth: 32) } == nil, "\(bad)")
        }
    }

    @Test func depthIsLimited() {
        let deep = #"{"a":"# + String(repeating: "[", count: 40) + String(repeating: "]", count: 40) + "}"
        #expect(scan(deep, depth: 32) == nil)
        #expect(scan(deep, depth: 64) != nil)
    }

    /// Mutations of valid messages (bytes replaced, deleted, duplicated; truncation): whatever the
    /// scanner accepts, json-c must accept too, and the id span must match the splice scanner's.
    @Test func neverAcceptsWhatJsonCRejects() {
        var rng = SplitMix64(seed: 0x5eed)
        let alphabet = Array(#"{}[]":,.-+0123456789eE \tnulltruefalse\u"#.utf8) + [0x00, 0x0A, 0xC3, 0xA9, 0xFF, 0x27]
        var accepted = 0
        for _ in 0..<20_000 {
            var b = Array(ScanMessageTests.good[Int(rng.next() % UInt64(ScanMessageTests.good.count))].utf8)
            for _ in 0...(rng.next() % 3) {
                guard !b.isEmpty else { break }
                let at = Int(rng.next() % UInt64(b.count))
                switch rng.next() % 4 {
                case 0: b[at] = alphabet[Int(rng.next() % UInt64(alphabet.count))]
                case 1: b.remove(at: at)
                case 2: b.insert(b[at], at: at)
                default: b.removeLast(b.count - at)
                }
            }
            let spans = b.withUnsafeBytes { RawJSON.spans($0, maxDepth: 32) }
            guard let spans else { continue }
            accepted += 1
            let ok = b.withUnsafeBytes { (try? Tokener(maxDepth: 64).parse($0)) != nil }
            #expect(ok, "scanner accepted what json-c rejects: \(String(decoding: b, as: UTF8.self))")
            // The id the splice replaces is the one a reader decoding keys finds.
            let id = b.withUnsafeBytes { t in
                Array("id".utf8).withUnsafeBytes { RawJSON.member(t, RawJSON.skipSpace(t, 0)..<t.count, named: $0) }
            }
            #expect(id == spans.id)
        }
        #expect(accepted > 1000, "the mutations must also exercise the accepting side")
    }
}

extension RawJSON {
    /// The spans when `classifyMessage` accepts the line, else nil (unsure or invalid).
    static func spans(_ t: UnsafeRawBufferPointer, maxDepth: Int) -> MessageSpans? {
        if case .message(let m) = classifyMessage(t, maxDepth: maxDepth) { return m }
        return nil
    }
}
