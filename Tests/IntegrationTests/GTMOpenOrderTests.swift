import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Issue 32 item 5: a `gtm.getValue` pipelined behind its caller's own `gtm.openContainer` on one
/// connection waits for the open's answer and reads the container the open settled on; an
/// answer from a container that is not open (the open answered without any container) says so.
@Suite(.serialized) struct GTMOpenOrderTests {
    /// Sends `openContainer` then `getValue` as one write and reads both answers, by id.
    func pipelined(_ c: SyncClient, _ id: String, key: String, open: JSONObject = [:]) throws -> (open: JSON, value: JSON) {
        var openParams: JSONObject = ["containerId": .string(id)]
        for (k, v) in open { openParams[k] = v }
        let lines =
            Envelope.request(id: .int(1), method: "gtm.openContainer", params: .params(.object(openParams))) + [0x0A]
            + Envelope.request(
                id: .int(2), method: "gtm.getValue", params: .params(["containerId": .string(id), "key": .string(key)])) + [0x0A]
        try c.sendRaw(lines)
        var answers: [JSON] = []
        while answers.count < 2 {
            guard let m = try c.readMessage(timeoutMs: 20_000) else { throw TestFailure(description: "no answer within 20 s") }
            if m["id"] != nil { answers.append(m) }
        }
        #expect(answers.map { $0["id"] } == [.int(1), .int(2)], "the open is answered first: the getValue waited for it")
        let open = answers.first { $0["id"] == .int(1) }?["result"] ?? .null
        let value = answers.first { $0["id"] == .int(2) }?["result"] ?? .null
        return (open, value)
    }

    /// The backend answers late (400 ms): before the fix the getValue evaluated the empty
    /// placeholder at once and answered `{"value":""}` with no `open: false`.
    @Test func aGetValuePipelinedBehindItsOpenReadsTheOpenedContainer() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-T2", gtmResource(["discount": "0%"]))
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        try b.faults(["latencyMs": 400])
        let (open, value) = try pipelined(c, "GTM-T2", key: "discount")
        #expect(open["source"] == "network" && open["isDefault"] == false, "\(open)")
        #expect(value == ["value": "0%"], "\(value)")
        try b.clearFaults()
    }

    /// The open times out (no default container, the network slower than the open's 200 ms):
    /// the getValue behind it is answered after it, with the type default and `open: false`.
    @Test func aGetValueBehindAnOpenThatTimesOutSaysNotOpen() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-T3", gtmResource(["discount": "5%"]))
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        try b.faults(["latencyMs": 1500])
        let (open, value) = try pipelined(c, "GTM-T3", key: "discount", open: ["openType": "prefer_fresh", "timeoutMs": 200])
        #expect(open["isDefault"] == true, "\(open)")
        #expect(value["value"] == "" && value["open"] == false && value["reason"] == "not_loaded", "\(value)")
        try b.clearFaults()
        // Once the network copy arrives the container is open and answers from it.
        try waitUntil(timeout: 10) { try c.value("GTM-T3", "discount") == "5%" }
        let r = try c.call("gtm.getValue", ["containerId": "GTM-T3", "key": "discount"])
        #expect(r["open"] == nil, "\(r)")
    }

    /// The open fails (the backend answers 503, no default container): the same.
    @Test func aGetValueBehindAFailedOpenSaysNotOpen() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        try b.faults(["failNext": 3, "status": 503])
        let (open, value) = try pipelined(c, "GTM-T4", key: "discount", open: ["timeoutMs": 600_000])
        #expect(open["isDefault"] == true, "\(open)")
        #expect(value["open"] == false && value["reason"] == "not_loaded", "\(value)")
        try b.clearFaults()
    }
}
