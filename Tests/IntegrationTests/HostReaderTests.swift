import Foundation
import PylonClientKit
import Testing

/// The host's one reader of a message line (docs/PROTOCOL.md, "Canonical form"): keys decoded by
/// the scan, so an escaped routing key or consent field takes the fast path and means what it
/// says; a routing member written twice is refused.
@Suite(.serialized) struct HostReaderTests {
    func routedFast(_ h: TestHost) throws -> Int64 {
        try h.status()["counters"]?["routed_fast"]?.intValue ?? -1
    }

    @Test func anIdWrittenWithEscapesTakesTheFastPathAndIsAnsweredWithIt() throws {
        let h = try TestHost()
        let c = try h.client()
        let before = try routedFast(h)
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","\u0069\u0064":"q-1","method":"echo.echo","params":{"a":1}}"#)
        #expect(r["id"] == .string("q-1") && r["result"] == ["a": 1], "\(r.serialized)")
        #expect(try routedFast(h) == before + 2, "the request and its answer, both from their bytes")
    }

    @Test func aConsentFieldWrittenWithEscapesIsReadOnTheFastPath() throws {
        let h = try TestHost()
        let c = try h.client()
        _ = try c.call("consent.set", ["key": "echo:A", "granted": false])
        let before = try routedFast(h)
        let ok = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.collect","params":{"app\u004bey":"B","data":2}}"#)
        #expect(ok["result"]?["stored"] == .int(2), "\(ok.serialized)")
        #expect(try routedFast(h) == before + 2, "switch echo:B read from the bytes: routed without json-c")
        let denied = try c.roundTrip(#"{"jsonrpc":"2.0","id":2,"method":"echo.collect","params":{"app\u004bey":"\u0041","data":3}}"#)
        #expect(denied.errorCode == -32003, "\(denied.serialized)")
        #expect(denied["error"]?["data"]?["switch"] == .string("echo:A"))
    }

    @Test func aRoutingMemberWrittenTwiceIsRefused() throws {
        let h = try TestHost()
        let c = try h.client()
        for bad in [
            #"{"jsonrpc":"2.0","id":1,"method":"echo.echo","method":"bus.ping"}"#,
            #"{"jsonrpc":"2.0","id":2,"method":"echo.echo","params":{"a":1},"p\u0061rams":{"b":2}}"#,
            #"{"jsonrpc":"2.0","id":3,"method":"echo.echo","params":{},"_onBehalfOf":1,"_onBehalfOf":2}"#,
            #"{"jsonrpc":"2.0","jsonrpc":"2.0","id":4,"method":"echo.echo"}"#,
        ] {
            let r = try c.roundTrip(bad)
            #expect(r.errorCode == -32600, "\(bad) → \(r.serialized)")
            #expect(r["error"]?["message"]?.stringValue?.contains("appears more than once") == true, "\(r.serialized)")
        }
        // Other keys may repeat (the last wins), and the connection goes on.
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":5,"method":"echo.echo","params":{"a":1,"a":2},"x":1,"x":2}"#)["result"] == ["a": 2])
    }

    /// The plugin kit finds escaped top-level keys decoded too: the params a `.text` method gets
    /// are the line's bytes (the sender's canonical text), not json-c's re-print of them.
    @Test func thePluginGetsTheParamsBytesWhenATopLevelKeyIsEscaped() throws {
        let h = try TestHost()
        let c = try h.client()
        let params = #"{"s":"a\/b","e":"\u00e9","n":1E2}"#
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"m\u0065thod":"echo.echo","p\u0061rams":"# + params + "}")
        var buf = [UInt8]()
        var byte: UInt8 = 0
        while read(c.fd, &byte, 1) == 1, byte != 0x0A { buf.append(byte) }
        let line = String(decoding: buf, as: UTF8.self)
        #expect(line == #"{"jsonrpc":"2.0","id":1,"result":"# + params + "}", "\(line)")
    }
}
