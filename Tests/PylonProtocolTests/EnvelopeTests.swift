import PylonCore
import PylonProtocol
import Testing

@Suite struct EnvelopeTests {
    private func text(_ b: [UInt8]) -> String { String(decoding: b, as: UTF8.self) }

    @Test func eachEnvelopeHasOneFixedShape() {
        #expect(
            text(Envelope.request(id: .int(7), method: "ma.eventRecord", params: .value(["a": 1])))
                == #"{"jsonrpc":"2.0","id":7,"method":"ma.eventRecord","params":{"a":1}}"#)
        #expect(
            text(Envelope.request(id: .value("x"), method: "bus.ping", onBehalfOf: -3))
                == #"{"jsonrpc":"2.0","id":"x","method":"bus.ping","_onBehalfOf":-3}"#)
        #expect(
            text(Envelope.notification(method: "consent.changed", params: .value(["key": "k"])))
                == #"{"jsonrpc":"2.0","method":"consent.changed","params":{"key":"k"}}"#)
        #expect(text(Envelope.notification(method: "bus.shutdown")) == #"{"jsonrpc":"2.0","method":"bus.shutdown"}"#)
        #expect(text(Envelope.result(id: .null, .value([:]))) == #"{"jsonrpc":"2.0","id":null,"result":{}}"#)
        #expect(
            text(Envelope.error(id: .int(Int64.min), RPCError(.timeout, "late")))
                == #"{"jsonrpc":"2.0","id":-9223372036854775808,"error":{"code":-32002,"message":"late"}}"#)
    }

    @Test func piecesInEveryFormWriteTheSameText() throws {
        let params: JSON = ["s": "é\n\"", "n": [1, 2.5, .null, true]]
        let fromValue = Envelope.result(id: .int(1), .value(params))
        let ref = JSONRef(params)
        let fromRef = Envelope.result(id: .int(1), .ref(ref.ptr))
        let fromText = ref.withSerialized { Envelope.result(id: .int(1), .text($0)) }
        #expect(fromValue == fromRef)
        #expect(fromValue == fromText)
        let back = try JSON.parse(text(fromValue))
        #expect(back["result"] == params)
        #expect(text(Envelope.result(id: .ref(nil), .null)) == #"{"jsonrpc":"2.0","id":null,"result":null}"#)
    }

    @Test func methodNamesAreEscapedWhenTheyNeedIt() throws {
        for name in ["plain.name", "quote\"d", "back\\slash", "ctl\u{01}", "ütf8.método"] {
            let line = text(Envelope.request(id: .int(1), method: name))
            #expect(try JSON.parse(line)["method"] == .string(name), "\(line)")
            let note = text(Envelope.notification(method: name, params: .value(.null)))
            #expect(try JSON.parse(note)["method"] == .string(name))
        }
    }

    @Test func paramsPieceOmitsNullAndAbsent() {
        #expect(JSONPiece.params(nil) == nil)
        #expect(JSONPiece.params(.null) == nil)
        #expect(text(Envelope.request(id: .int(2), method: "m", params: .params(.null))) == #"{"jsonrpc":"2.0","id":2,"method":"m"}"#)
    }

    @Test func errorDataAndResponseResultRoundTrip() throws {
        let e = RPCError(.consentDenied, "denied", data: ["key": "ma:app"])
        let ref = try Envelope.error(id: .int(3), e).withUnsafeBytes { try JSONRef.parse($0) }
        #expect(ref.responseResult == .failure(e))
        let ok = try Envelope.result(id: .int(3), .value(["x": 1])).withUnsafeBytes { try JSONRef.parse($0) }
        #expect(ok.responseResult == .success(["x": 1]))
    }
}

@Suite struct HandshakeTypesTests {
    @Test func manifestRoundTripsThroughHelloParams() throws {
        var m = Manifest(name: "ma", version: "2.1")
        m.add(Manifest.Method(name: "eventRecord", consent: "ma:{appKey}", dropWhenDenied: true, deniedResult: ["code": 0]))
        m.add(Manifest.Method(name: "ma.start"))
        m.publishes = ["ma.session"]
        m.subscribes = [TopicPattern("consent.*")]
        m.callerInfo = true
        let hello = m.helloParams(pid: 42)
        #expect(hello["pid"] == 42)
        let back = try Manifest.parse(hello)
        #expect(back == m)
        #expect(back.methodOrder == ["ma.eventRecord", "ma.start"])
    }

    /// `afterDeadline: "continues"` (a plugin that carries on past the host's deadline: pending,
    /// -32008) is part of the handshake, not of `bus.describe`.
    @Test func aMethodThatContinuesAfterTheDeadlineRoundTrips() throws {
        var m = Manifest(name: "ma", version: "1")
        m.add(Manifest.Method(name: "start", continuesAfterDeadline: true))
        m.add(Manifest.Method(name: "status"))
        let hello = m.helloParams(pid: 1)
        let methods = hello["manifest"]?["methods"]?.arrayValue ?? []
        #expect(methods.first?["afterDeadline"] == "continues")
        #expect(methods.last?["afterDeadline"] == nil)
        #expect(m.json["methods"]?.arrayValue?.first?["afterDeadline"] == nil)
        let back = try Manifest.parse(hello)
        #expect(back.methods["ma.start"]?.continuesAfterDeadline == true)
        #expect(back.methods["ma.status"]?.continuesAfterDeadline == false)
        #expect(back == m)
    }

    @Test func manifestRefusesAnUnsupportedProtocol() {
        var hello = Manifest(name: "x", version: "1").helloParams(pid: 1)
        if case .object(var o) = hello { o["protocol"] = 99; hello = .object(o) }
        #expect(throws: RPCError.self) { try Manifest.parse(hello) }
    }

    @Test func welcomeRoundTripsAndReadsTheConsentSnapshot() {
        let snapshot = ConsentSnapshot(master: false, switches: ["ma:a": true, "ma:b": false])
        let w = Welcome(
            config: ["endpoint": "http://x"], stateDir: "/s/plugins/ma", consent: snapshot.json,
            heartbeatMs: 5_000, limits: ["maxLineBytes": 1024])
        let back = Welcome(json: w.json)
        #expect(back == w)
        #expect(back.consentSnapshot == snapshot)
        // Defaults for a sparse welcome (an older host).
        let sparse = Welcome(json: ["config": ["a": 1]])
        #expect(sparse.consentSnapshot == ConsentSnapshot())
        #expect(sparse.stateDir == "")
    }
}

@Suite struct InboundEnvelopeTests {
    private func classify(_ text: String) throws -> (InboundEnvelope, JSONRef) {
        let ref = try Array(text.utf8).withUnsafeBytes { try JSONRef.parse($0) }
        return (InboundEnvelope.classify(ref), ref)
    }

    private func refusal(_ text: String) throws -> (message: String, answer: Bool)? {
        guard case .invalid(let e, _, let answer) = try classify(text).0 else { return nil }
        #expect(e.code == RPCError.Code.invalidRequest.rawValue)
        return (e.message, answer)
    }

    @Test func classifiesRequestsNotificationsAndResponses() throws {
        guard case .request(let m, let id) = try classify(#"{"jsonrpc":"2.0","id":"a","method":"ma.start","params":{}}"#).0 else {
            Issue.record("not a request"); return
        }
        #expect(m == "ma.start")
        #expect(id != nil)
        guard case .notification("x.y") = try classify(#"{"jsonrpc":"2.0","method":"x.y","params":[1]}"#).0 else {
            Issue.record("not a notification"); return
        }
        guard case .response = try classify(#"{"jsonrpc":"2.0","id":4,"error":{"code":1,"message":"m"}}"#).0 else {
            Issue.record("not a response"); return
        }
    }

    @Test func refusesEachBrokenRuleWithItsOwnMessage() throws {
        #expect(try refusal(#"[1]"#)?.message.contains("batch") == true)
        #expect(try refusal(#""s""#)?.message.contains("JSON object") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":[1],"method":"a.b"}"#)?.message.contains("id must be") == true)
        #expect(try refusal(#"{"jsonrpc":"1.0","id":1,"method":"a.b"}"#)?.message.contains("2.0") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1}"#)?.message.contains("not a request") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1,"method":5}"#)?.message.contains("must be a string") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1,"method":"a.b","params":3}"#)?.message.contains("params") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1,"method":"a b"}"#)?.message.contains("printable ASCII") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1,"method":"a\u0000b"}"#)?.message.contains("printable ASCII") == true)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1,"method":"a.b","_pylon":{}}"#)?.message.contains("_pylon") == true)
        let long = String(repeating: "m", count: InboundEnvelope.maxMethodBytes + 1)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":1,"method":"\#(long)"}"#) != nil)
        #expect(InboundEnvelope.isValidMethodName(String(long.dropLast())))
    }

    @Test func aNotificationBreakingARuleGetsNoAnswer() throws {
        #expect(try refusal(#"{"jsonrpc":"2.0","method":"a.b","params":"x"}"#)?.answer == false)
        #expect(try refusal(#"{"jsonrpc":"2.0","method":"a.b","_pylon":1}"#)?.answer == false)
        #expect(try refusal(#"{"jsonrpc":"2.0","id":null,"method":"a.b","params":"x"}"#)?.answer == true)
    }
}
