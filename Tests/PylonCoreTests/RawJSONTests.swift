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

/// Keys as json-c names them: escapes decoded, cut at U+0000.
struct JSONCKeyNameTests {
    func name(_ keyText: String) -> (String, Bool) {
        let bytes = Array(keyText.utf8)
        return bytes.withUnsafeBytes { b in
            let (n, nul) = RawJSON.jsonCKeyName(b, 0..<b.count)
            return (String(decoding: n, as: UTF8.self), nul)
        }
    }

    @Test func decodesLikeJsonCAndCutsAtNUL() throws {
        #expect(name(#"id"#) == ("id", false))
        #expect(name(#"i\u0064"#) == ("id", false))
        #expect(name(#"\u0069\u0044"#) == ("iD", false))
        #expect(name(#"id\u0000x"#) == ("id", true))
        #expect(name(#"a\"b\\c\/d\n"#) == ("a\"b\\c/d\n", false))
        #expect(name(#"\ud83d\ude00!"#) == ("😀!", false))
        // Against json-c: random keys with escapes, parsed as the only key of an object.
        var rng = SystemRandomNumberGenerator()
        let pieces = [#"a"#, #"\u0041"#, #"\n"#, #"\""#, #"\\"#, #"\/"#, #"\u00e9"#, #"é"#, #"\ud83d\ude00"#, #"\u0000"#, #"\t"#]
        for _ in 0..<300 {
            let key = (0..<Int.random(in: 1...6, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined()
            let parsed = try JSON.parse("{\"" + key + "\":1}")
            let jsoncKey = try #require(parsed.objectValue?.keys.first)
            #expect(name(key).0 == jsoncKey, "\(key)")
        }
    }

    func members(_ s: String) -> [String] {
        let bytes = Array(s.utf8)
        return bytes.withUnsafeBytes { b in RawJSON.topLevelMembers(b, named: "id").map { String(decoding: bytes[$0], as: UTF8.self) } }
    }

    @Test func topLevelMembersFindEverySpelling() {
        #expect(members(#"{"id":1,"method":"x"}"#) == ["1"])
        #expect(members(#"{"id":1,"i\u0064":2}"#) == ["1", "2"])
        #expect(members(#"{"params":{"i\u0064":1},"\u0069d":"a"}"#) == [#""a""#])
        #expect(members(#"{"id\u0000z":3}"#) == ["3"])
        #expect(members(#"{"idx":1}"#) == [])
    }

    func nulKey(_ s: String) -> Bool { Array(s.utf8).withUnsafeBytes { RawJSON.hasNULKey($0) } }

    @Test func aKeyHoldingNULIsFoundAtAnyDepthButNotInValues() {
        #expect(!nulKey(#"{"a":"x\u0000y","b":["\u0000"]}"#))
        #expect(nulKey(#"{"a\u0000":1}"#))
        #expect(nulKey(#"{"p":{"q":[{"k\u0000":1}]}}"#))
        #expect(!nulKey(#"{"a\\u0000":1}"#), "an escaped backslash, then text")
        // The scan leaves such keys to json-c (and so to the host's check).
        let line = Array(#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"c":"a","c\u0000":"b"}}"#.utf8)
        #expect(line.withUnsafeBytes { RawJSON.classifyMessage($0, maxDepth: 64) } == .unsure)
    }
}
