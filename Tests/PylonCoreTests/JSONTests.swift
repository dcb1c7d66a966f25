import Testing

@testable import PylonCore

struct JSONTests {
    @Test func roundTripsThroughJsonC() throws {
        let v: JSON = ["a": 1, "b": [true, .null, "x"], "c": ["d": 2.5]]
        let text = v.serialized
        #expect(try JSON.parse(text) == v)
    }

    @Test func objectKeepsInsertionOrder() throws {
        let v = try JSON.parse(#"{"z":1,"a":2,"m":3}"#)
        #expect(v.objectValue?.keys == ["z", "a", "m"])
        #expect(v.serialized == #"{"z":1,"a":2,"m":3}"#)
    }

    @Test func bareScalarsParse() throws {
        #expect(try JSON.parse("42") == .int(42))
        #expect(try JSON.parse(" \"s\" ") == .string("s"))
    }

    @Test func syntaxErrorIsReported() {
        #expect(throws: JSONParseError.self) { try JSON.parse("{\"a\":}") }
        #expect(throws: JSONParseError.self) { try JSON.parse("{\"a\" 1}") }
        #expect(throws: JSONParseError.self) { try JSON.parse("[1,2") }
    }

    @Test func trailingGarbageIsRejected() {
        do {
            _ = try JSON.parse(#"{"a":1} x"#)
            Issue.record("expected an error")
        } catch {
            #expect(error.kind == .trailing)
        }
    }

    @Test func twoObjectsOnOneLineAreRejected() {
        #expect(throws: JSONParseError.self) { try JSON.parse(#"{"a":1}{"b":2}"#) }
    }

    @Test func nestingBeyondLimitIsRejected() {
        let deep = String(repeating: "[", count: 20) + String(repeating: "]", count: 20)
        #expect(throws: Never.self) { try JSON.parse(deep, maxDepth: 32) }
        do {
            _ = try JSON.parse(deep, maxDepth: 10)
            Issue.record("expected an error")
        } catch {
            #expect(error.kind == .depth)
        }
    }

    @Test func invalidUTF8IsRejected() {
        let bytes: [UInt8] = Array(#"{"a":""#.utf8) + [0xC3, 0x28] + Array(#""}"#.utf8)
        let r: Result<JSONRef, JSONParseError> = bytes.withUnsafeBytes { b in
            do throws(JSONParseError) { return .success(try JSONRef.parse(b)) } catch { return .failure(error) }
        }
        guard case .failure(let e) = r else { Issue.record("expected an error"); return }
        #expect(e.kind == .utf8)
    }

    @Test func unicodeStringsSurvive() throws {
        let v = try JSON.parse(#"{"s":"héllo \u263a 日本"}"#)
        #expect(v["s"]?.stringValue == "héllo ☺ 日本")
    }

    @Test func integersKeep64Bits() throws {
        #expect(try JSON.parse("9007199254740993") == .int(9_007_199_254_740_993))
    }
}
