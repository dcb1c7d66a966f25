import Testing

@testable import PylonCore

struct RawJSONTests {
    func span(_ s: String, _ key: StaticString = "id") -> String? {
        let bytes = Array(s.utf8)
        return bytes.withUnsafeBytes { b in
            RawJSON.memberValueSpan(b, key: key).map { String(decoding: bytes[$0], as: UTF8.self) }
        }
    }

    @Test func findsTopLevelIdOfEveryType() {
        #expect(span(#"{"jsonrpc":"2.0","id":42,"method":"x"}"#) == "42")
        #expect(span(#"{"id":"a,b}\"c","method":"x"}"#) == #""a,b}\"c""#)
        #expect(span(#"{"method":"x","id":null}"#) == "null")
        #expect(span(#"{ "id" : -1.5e3 , "x":1}"#) == "-1.5e3")
    }

    /// `_answers.ids` (Bus+Answers): plain integers only, anything else is not an id list.
    @Test func intArrayReadsPlainIntegersOnly() {
        func ints(_ s: String) -> [Int64]? {
            let b = Array(s.utf8)
            return b.withUnsafeBytes { RawJSON.intArray($0, 0..<b.count) }
        }
        #expect(ints("[1,2,3]") == [1, 2, 3])
        #expect(ints(" [ 7 , -8 ] ") == [7, -8])
        #expect(ints("[]") == [])
        #expect(ints("[9223372036854775807]") == [Int64.max])
        #expect(ints("[9223372036854775808]") == nil, "overflow")
        #expect(ints("[1.5]") == nil)
        #expect(ints("[1e3]") == nil)
        #expect(ints(#"["1"]"#) == nil)
        #expect(ints("[1,]") == nil)
        #expect(ints("[1 2]") == nil)
        #expect(ints("[null]") == nil)
        #expect(ints("{}") == nil)
        #expect(ints("[1") == nil)
    }

    @Test func ignoresNestedIds() {
        #expect(span(#"{"params":{"id":1,"list":[{"id":2}]},"id":3}"#) == "3")
        #expect(span(#"{"params":{"id":1}}"#) == nil)
        #expect(span(#"{"note":"\"id\":9","id":"real"}"#) == #""real""#)
    }

    @Test func lastDuplicateWinsLikeJsonC() throws {
        let text = #"{"id":1,"method":"x","id":2}"#
        #expect(span(text) == "2")
        #expect(try JSON.parse(text)["id"] == .int(2))
    }

    @Test func keysAreComparedExactly() {
        #expect(span(#"{"idx":1,"id":2}"#) == "2")
        #expect(span(#"{"i":1}"#) == nil)
    }

    @Test func agreesWithJsonCOnRandomisedMessages() throws {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let id: JSON =
                Bool.random(using: &rng)
                ? .int(Int64.random(in: -1000...1000, using: &rng)) : .string("k\(Int.random(in: 0...99, using: &rng))")
            var o = JSONObject()
            let keys = ["jsonrpc", "method", "params", "id"].shuffled(using: &rng)
            for k in keys {
                switch k {
                case "id": o[k] = id
                case "params": o[k] = ["id": "inner", "a": [1, ["id": 5]], "s": "} ] , \" id"]
                default: o[k] = .string(k)
                }
            }
            let text = JSON.object(o).serialized
            let found = try #require(span(text))
            #expect(try JSON.parse(found) == id)
        }
    }
}

struct DuplicateKeyTests {
    func dup(_ s: String) -> String? { Array(s.utf8).withUnsafeBytes { RawJSON.duplicateKey(in: $0) } }

    @Test func findsARepeatedKeyAtAnyDepth() {
        #expect(dup(#"{"a":1,"b":2}"#) == nil)
        #expect(dup(#"{"a":1,"a":2}"#) == "a")
        #expect(dup(#"{"x":{"s":{"k":true,"k":false}}}"#) == "k")
        #expect(dup(#"{"x":[{"k":1},{"k":2}]}"#) == nil, "the same key in two objects is fine")
        #expect(dup(#"[{"q":1, "q" : 2}]"#) == "q")
        #expect(dup(#"{"s":"{\"a\":1,\"a\":2}"}"#) == nil, "inside a string is not a key")
    }
}

/// The host's scan of a line (`classifyMessage`): keys decoded, repeated routing members and keys
/// holding U+0000 refused (docs/PROTOCOL.md, "Canonical form" and "Known limitations").
struct HostScanRuleTests {
    func classify(_ s: String, depth: Int = 64) -> RawJSON.ScanOutcome {
        Array(s.utf8).withUnsafeBytes { RawJSON.classifyMessage($0, maxDepth: depth) }
    }

    func text(_ s: String, _ r: Range<Int>?) -> String? { r.map { String(decoding: Array(s.utf8)[$0], as: UTF8.self) } }

    @Test func escapedTopLevelKeysAreDecoded() throws {
        let s = #"{"jsonrpc":"2.0","i\u0064":"x","\u006dethod":"a.b","par\u0061ms":{"k":1}}"#
        guard case .message(let m) = classify(s) else { Issue.record("\(classify(s))"); return }
        #expect(text(s, m.id) == #""x""#)
        #expect(text(s, m.method) == #""a.b""#)
        #expect(text(s, m.params) == #"{"k":1}"#)
        // Nested keys are not routing members; a key that only looks like one is not `id`.
        guard case .message(let n) = classify(#"{"params":{"i\u0064":1},"\\id":2}"#) else { Issue.record("nested"); return }
        #expect(n.id == nil && n.params != nil)
    }

    @Test func aRepeatedRoutingMemberIsRefusedHoweverItIsSpelled() {
        for (line, member) in [
            (#"{"id":1,"id":2}"#, "id"), (#"{"id":1,"i\u0064":2}"#, "id"), (#"{"\u0069d":1,"id":2}"#, "id"),
            (#"{"jsonrpc":"2.0","jsonrpc":"2.0"}"#, "jsonrpc"), (#"{"method":"a","method":"b"}"#, "method"),
            (#"{"params":{},"params":[]}"#, "params"), (#"{"result":1,"result":2}"#, "result"),
            (#"{"error":{},"error":{}}"#, "error"), (#"{"_pylon":{},"_pylon":{}}"#, "_pylon"),
            (#"{"_onBehalfOf":1,"_onBehalfOf":2}"#, "_onBehalfOf"),
        ] {
            #expect(classify(line) == .repeated(member: member), "\(line)")
        }
        // Other keys repeat freely (the last wins), at the top and inside.
        guard case .message(let m) = classify(#"{"x":1,"x":2,"id":3,"params":{"id":1,"id":2}}"#) else {
            Issue.record("other keys")
            return
        }
        #expect(m.id != nil)
        // Invalid text is invalid first.
        if case .invalid = classify(#"{"id":1,"id":2"#) {} else { Issue.record("truncated") }
    }

    @Test func aKeyHoldingNULIsRefusedAtAnyDepthButNotInValues() {
        #expect(classify(#"{"a\u0000":1}"#) == .nulKey)
        #expect(classify(#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"c":"a","c\u0000":"b"}}"#) == .nulKey)
        #expect(classify(#"{"p":{"q":[{"k\u0000":1}]}}"#) == .nulKey)
        #expect(classify(#"{"i\u0064\u0000":1}"#) == .nulKey)
        if case .message = classify(#"{"a":"x\u0000y","b":["\u0000"]}"#) {} else { Issue.record("values may hold U+0000") }
        if case .message = classify(#"{"a\\u0000":1}"#) {} else { Issue.record("an escaped backslash, then text") }
        #expect(Array(#"[{"k\u0000":1}]"#.utf8).withUnsafeBytes { RawJSON.hasNULKey($0) })
        #expect(!Array(#"[{"k\\u0000":"\u0000"}]"#.utf8).withUnsafeBytes { RawJSON.hasNULKey($0) })
    }

    @Test func theScanDecidesSurrogatesDepthAndNonObjects() {
        if case .message = classify(#"{"a":"\ud83d\ude00","b":"\udc00"}"#) {} else { Issue.record("surrogates") }
        let deep = #"{"a":"# + String(repeating: "[", count: 20) + String(repeating: "]", count: 20) + "}"
        #expect(classify(deep, depth: 16) == .tooDeep)
        if case .message = classify(deep, depth: 21) {} else { Issue.record("21 levels") }
        #expect(classify("[1,2]") == .notObject)
        #expect(classify("42") == .notObject)
        if case .invalid = classify("[1,2,]") {} else { Issue.record("a batch is validated too") }
        if case .invalid = classify("not json") {} else { Issue.record("not json") }
    }
}
