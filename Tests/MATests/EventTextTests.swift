import PylonPluginKit
import Testing

@testable import pylon_ma

/// Event records written as JSON text (EventText) must parse to the record the uploader and the
/// backend expect, whatever bytes the app put in the event's name and properties.
struct EventTextTests {
    private func record(
        name: String, euid: String?, session: String?, properties: String,
        utm: [String: String] = [:], device: [(String, String)] = [("os", "linux")]
    ) throws -> JSON {
        var out: [UInt8] = []
        var n = name
        var p = properties
        n.withUTF8 { nb in
            p.withUTF8 { pb in
                EventText.record(
                    idPrefix: Array("dev-abc".utf8), seq: 42, name: UnsafeRawBufferPointer(nb), timeMs: 1_732_900_000_123,
                    euid: euid, session: session, properties: UnsafeRawBufferPointer(pb),
                    tail: EventText.tail(utm: utm, device: device), into: &out)
            }
        }
        return try JSON.parse(String(decoding: out, as: UTF8.self))
    }

    @Test func aRecordHasTheDocumentedShape() throws {
        let r = try record(
            name: "purchase", euid: "E1", session: nil, properties: #"{"sku":"A-1","price":9.99,"n":[1,{"a":null}]}"#,
            utm: ["utm_source": "news", "utm_campaign": "c1"], device: [("os", "linux"), ("carrier", "Op")])
        #expect(r["id"] == "dev-abc-42")
        let d = try #require(r["data"])
        #expect(d["event"] == "purchase")
        #expect(d["time"] == .int(1_732_900_000_123))
        #expect(d["euid"] == "E1")
        #expect(d["session"] == .null)
        #expect(d["properties"] == ["sku": "A-1", "price": 9.99, "n": [1, ["a": .null]]])
        #expect(d["utm"] == ["utm_source": "news", "utm_campaign": "c1"])
        #expect(d["device"] == ["os": "linux", "carrier": "Op"])
        #expect(d.objectValue?.count == 7)
    }

    @Test func utmIsLeftOutWhenEmpty() throws {
        let d = try #require(try record(name: "e", euid: nil, session: "s1", properties: "{}")["data"])
        #expect(d["utm"] == nil)
        #expect(d["euid"] == .null)
        #expect(d["session"] == "s1")
    }

    @Test(arguments: ["quote\"d", "back\\slash", "line\nbreak\r\t", "ctl\u{01}\u{1F}\u{08}\u{0C}", "é漢字🙂", "a/b", "\u{7F}"])
    func namesAreEscapedAndReadBackExactly(name: String) throws {
        let r = try record(name: name, euid: "e\"u", session: "s\\1", properties: "{}")
        #expect(r["data"]?["event"]?.stringValue == name)
        #expect(r["data"]?["euid"] == "e\"u")
        #expect(r["data"]?["session"] == "s\\1")
    }

    @Test(arguments: [Int64.min + 1, -1, 0, 7, 1_732_900_000_123, Int64.max])
    func decimals(value: Int64) {
        var out: [UInt8] = []
        JSONText.appendDecimal(value, to: &out)
        #expect(String(decoding: out, as: UTF8.self) == String(value))
    }

    @Test func batchParamsParseAsAnEnqueue() throws {
        var text: [UInt8] = []
        EventText.paramsHead(stream: "ma.app", consent: "ma:app", into: &text)
        for i in 0..<3 {
            if i > 0 { text.append(UInt8(ascii: ",")) }
            "{}".utf8CString.withUnsafeBytes { p in
                "ev".utf8CString.withUnsafeBytes { n in
                    EventText.record(
                        idPrefix: Array("d".utf8), seq: UInt64(i), name: UnsafeRawBufferPointer(rebasing: n.dropLast()),
                        timeMs: 1, euid: nil, session: nil, properties: UnsafeRawBufferPointer(rebasing: p.dropLast()),
                        tail: EventText.tail(utm: [:], device: [("os", "linux")]), into: &text)
                }
            }
        }
        EventText.paramsTail(into: &text)
        let p = try JSON.parse(String(decoding: text, as: UTF8.self))
        #expect(p["stream"] == "ma.app")
        #expect(p["consent"] == "ma:app")
        #expect(p["records"]?.arrayValue?.compactMap { $0["id"]?.stringValue } == ["d-0", "d-1", "d-2"])
    }
}
